//! Log-mel features with the reference's precision steps (fixture README §7):
//! frames and pre-emphasis in float32, window product and FFT in float64, spectrum rounded to
//! complex64, power, mel product and log in float32. Following these steps matters: an all-f64
//! pipeline drifts by up to 7.5e-4 on quiet bins.

use super::constants::N_MELS;
use super::ln;
use super::mel::{self, N_BINS};
use rayon::prelude::*;
use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};
use std::sync::{Arc, OnceLock};

/// 16 kHz analysis window (25 ms).
pub const WIN_16K: usize = 400;
pub const HOP_16K: usize = 160;
const FFT_16K: usize = 512;
/// 8 kHz analysis window of the fillzero path.
pub const WIN_8K: usize = 200;
pub const HOP_8K: usize = 80;
const FFT_8K: usize = 256;
const PREEMPHASIS: f32 = 0.97;

/// `numpy.hamming(m)`, evaluated the way numpy does (`0.54 + 0.46·cos(π·n/(m−1))`, n = 1−m, 3−m, …).
fn hamming(m: usize) -> Vec<f64> {
    (0..m)
        .map(|i| {
            let n = 2.0 * i as f64 + 1.0 - m as f64;
            0.54 + 0.46 * (std::f64::consts::PI * n / (m as f64 - 1.0)).cos()
        })
        .collect()
}

/// Number of frames: `(n − win) // hop + 1`, zero when not even one window fits.
pub fn frame_count(n: usize, win: usize, hop: usize) -> usize {
    if n < win {
        0
    } else {
        (n - win) / hop + 1
    }
}

/// Features of a 16 kHz waveform: `([frames·80], frames)`.
pub fn log_mel_16k(wave: &[f32]) -> (Vec<f32>, usize) {
    static RECIPE: OnceLock<Recipe> = OnceLock::new();
    let recipe = RECIPE.get_or_init(|| Recipe::new(WIN_16K, HOP_16K, FFT_16K));
    extract(wave, recipe, power_16k)
}

/// |S|² of the 16 kHz recipe. numpy `abs` of complex64 is glibc's hypotf, which is the float64
/// square root of the float64 sum of squares rounded to float32 (checked bit for bit on 2·10⁸
/// pairs against `f32::hypot`); written out, it vectorises. The square stays float32.
#[inline(always)]
fn power_16k(spectrum: &[Complex<f64>], power: &mut [f32]) {
    for (p, c) in power.iter_mut().zip(spectrum) {
        let (re, im) = (f64::from(c.re as f32), f64::from(c.im as f32));
        let magnitude = (re * re + im * im).sqrt() as f32;
        *p = magnitude * magnitude;
    }
}

/// Features of an 8 kHz waveform through the original "fillzero" path: the 129-bin spectrum
/// loses its Nyquist bin and gains 129 zero bins, giving the 16 kHz bin spacing (31.25 Hz).
pub fn log_mel_8k_fillzero(wave: &[f32]) -> (Vec<f32>, usize) {
    static RECIPE: OnceLock<Recipe> = OnceLock::new();
    let recipe = RECIPE.get_or_init(|| Recipe::new(WIN_8K, HOP_8K, FFT_8K));
    extract(wave, recipe, |spectrum, power| {
        power.fill(0.0);
        for (p, c) in power.iter_mut().zip(&spectrum[..FFT_8K / 2]) {
            // The original concatenates with float64 zeros, so |S| is taken in float64 from the
            // complex64 values and only then cast to float32.
            let (re, im) = (f64::from(c.re as f32), f64::from(c.im as f32));
            let magnitude = re.hypot(im) as f32;
            *p = magnitude * magnitude;
        }
    })
}

/// Frames one task of the pool takes: ~100 µs of work, enough to amortise the hand-off, and a
/// 30 s clip (2998 frames) still splits into ~50 tasks.
const FRAMES_PER_TASK: usize = 64;

/// What every frame of one recipe shares, built once per process: the window and the FFT plan.
struct Recipe {
    win: usize,
    hop: usize,
    window: Vec<f64>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl Recipe {
    fn new(win: usize, hop: usize, n_fft: usize) -> Self {
        Self {
            win,
            hop,
            window: hamming(win),
            fft: RealFftPlanner::<f64>::new().plan_fft_forward(n_fft),
        }
    }
}

/// One worker's buffers.
struct Scratch {
    input: Vec<f64>,
    spectrum: Vec<Complex<f64>>,
    fft: Vec<Complex<f64>>,
    power: Vec<f32>,
}

/// Frames are independent, so they are spread over the caller's rayon pool (the plugin's bounded
/// media pool when serving) in blocks; each frame's arithmetic is the same in any split.
fn extract(
    wave: &[f32],
    recipe: &Recipe,
    to_power: impl Fn(&[Complex<f64>], &mut [f32]) + Sync,
) -> (Vec<f32>, usize) {
    let frames = frame_count(wave.len(), recipe.win, recipe.hop);
    let mut out = vec![0f32; frames * N_MELS];
    let scratch = || Scratch {
        input: recipe.fft.make_input_vec(),
        spectrum: recipe.fft.make_output_vec(),
        fft: recipe.fft.make_scratch_vec(),
        power: vec![0f32; N_BINS],
    };
    out.par_chunks_mut(FRAMES_PER_TASK * N_MELS)
        .enumerate()
        .for_each_init(scratch, |s, (block, rows)| {
            let first = block * FRAMES_PER_TASK;
            #[cfg(target_arch = "x86_64")]
            if crate::simd::has_avx2_fma() {
                // SAFETY: the CPU supports the features `frames_avx2` is compiled for.
                return unsafe { frames_avx2(wave, recipe, &to_power, s, first, rows) };
            }
            frames_body(wave, recipe, &to_power, s, first, rows);
        });
    (out, frames)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn frames_avx2(
    wave: &[f32],
    recipe: &Recipe,
    to_power: &impl Fn(&[Complex<f64>], &mut [f32]),
    s: &mut Scratch,
    first: usize,
    rows: &mut [f32],
) {
    frames_body(wave, recipe, to_power, s, first, rows);
}

/// The features of frames `first..` into `rows` (80 per frame). Everything but the FFT (which
/// rustfft dispatches itself) is inlined here, so that the AVX2 copy widens the window, the
/// magnitudes' float64 square roots and the logarithms to four float64 lanes.
#[inline(always)]
fn frames_body(
    wave: &[f32],
    recipe: &Recipe,
    to_power: &impl Fn(&[Complex<f64>], &mut [f32]),
    s: &mut Scratch,
    first: usize,
    rows: &mut [f32],
) {
    let (win, hop) = (recipe.win, recipe.hop);
    let bank = mel::bank();
    for (i, row) in rows.chunks_exact_mut(N_MELS).enumerate() {
        let t = first + i;
        let frame = &wave[t * hop..t * hop + win];
        // Pre-emphasis inside the frame; the first sample is emphasised against itself.
        let emphasised = |cur: f32, prev: f32| f64::from((cur - PREEMPHASIS * prev) * 32768.0);
        s.input[0] = recipe.window[0] * emphasised(frame[0], frame[0]);
        for (((x, w), &cur), &prev) in s.input[1..win]
            .iter_mut()
            .zip(&recipe.window[1..])
            .zip(&frame[1..])
            .zip(frame)
        {
            *x = w * emphasised(cur, prev);
        }
        s.input[win..].fill(0.0);
        recipe
            .fft
            .process_with_scratch(&mut s.input, &mut s.spectrum, &mut s.fft)
            .expect("buffers come from the plan and have its sizes");
        to_power(&s.spectrum, &mut s.power);
        for (energy_out, (first, weights)) in row.iter_mut().zip(&bank.sparse) {
            let energy: f32 = s.power[*first..*first + weights.len()]
                .iter()
                .zip(weights)
                .map(|(p, w)| p * w)
                .sum();
            *energy_out = energy.max(1.0);
        }
        ln::ln_in_place(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_counts() {
        assert_eq!(frame_count(399, 400, 160), 0);
        assert_eq!(frame_count(400, 400, 160), 1);
        assert_eq!(frame_count(56_400, 400, 160), 351);
        assert_eq!(frame_count(480_000, 400, 160), 2998);
        assert_eq!(frame_count(13274, 200, 80), 164);
    }

    /// The written-out |S| of `log_mel_16k` is this libm's `hypotf` (what numpy calls), bit for
    /// bit, over spectrum-like magnitudes from 1e-6 to 1e9.
    #[test]
    fn magnitude_formula_is_hypotf() {
        let mut state = 0x2545_f491u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state
        };
        for _ in 0..1_000_000 {
            let scale = |bits: u32| 10f32.powi((bits % 16) as i32 - 6);
            let re = (next() as f32 / u32::MAX as f32 - 0.5) * scale(next());
            let im = (next() as f32 / u32::MAX as f32 - 0.5) * scale(next());
            let (a, b) = (f64::from(re), f64::from(im));
            let written = (a * a + b * b).sqrt() as f32;
            assert_eq!(written.to_bits(), re.hypot(im).to_bits(), "{re:e} {im:e}");
        }
    }

    /// Frames split over any number of threads give the same features.
    #[test]
    fn features_do_not_depend_on_the_thread_count() {
        let wave: Vec<f32> = (0..48_000)
            .map(|i| (i as f32 * 0.013).sin() * 0.3 + ((i * 7919) % 101) as f32 / 2000.0)
            .collect();
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| (log_mel_16k(&wave), log_mel_8k_fillzero(&wave)))
        };
        assert_eq!(run(1), run(3));
    }

    /// The AVX2 copy of the frame loop computes the portable copy's bits, on both recipes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn frame_paths_agree() {
        if !crate::simd::has_avx2_fma() {
            eprintln!("no AVX2 and FMA on this CPU: only the portable path exists");
            return;
        }
        let wave: Vec<f32> = (0..24_000)
            .map(|i| (i as f32 * 0.021).sin() * 0.4 + ((i * 7919) % 211) as f32 / 3000.0 - 0.03)
            .collect();
        let magnitude = power_16k;
        for recipe in [
            Recipe::new(WIN_16K, HOP_16K, FFT_16K),
            Recipe::new(WIN_8K, HOP_8K, FFT_8K),
        ] {
            let frames = frame_count(wave.len(), recipe.win, recipe.hop);
            let scratch = || Scratch {
                input: recipe.fft.make_input_vec(),
                spectrum: recipe.fft.make_output_vec(),
                fft: recipe.fft.make_scratch_vec(),
                power: vec![0f32; N_BINS],
            };
            let (mut portable, mut fast) =
                (vec![0f32; frames * N_MELS], vec![0f32; frames * N_MELS]);
            frames_body(&wave, &recipe, &magnitude, &mut scratch(), 0, &mut portable);
            // SAFETY: checked above that the CPU has AVX2 and FMA.
            unsafe { frames_avx2(&wave, &recipe, &magnitude, &mut scratch(), 0, &mut fast) };
            assert!(portable
                .iter()
                .zip(&fast)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn hamming_is_symmetric_with_054_ends() {
        let w = hamming(400);
        assert!((w[0] - 0.08).abs() < 1e-15 && (w[399] - 0.08).abs() < 1e-15);
        assert!((w[10] - w[389]).abs() < 1e-15);
    }
}
