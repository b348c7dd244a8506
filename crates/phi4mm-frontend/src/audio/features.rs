//! Log-mel features with the reference's precision steps (fixture README §7):
//! frames and pre-emphasis in float32, window product and FFT in float64, spectrum rounded to
//! complex64, power, mel product and log in float32. Following these steps matters: an all-f64
//! pipeline drifts by up to 7.5e-4 on quiet bins.

use super::constants::N_MELS;
use super::mel::{self, N_BINS};
use realfft::RealFftPlanner;

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
    extract(wave, WIN_16K, HOP_16K, FFT_16K, |spectrum, power| {
        for (p, c) in power.iter_mut().zip(spectrum) {
            // numpy `abs` of complex64 is hypotf in float32; the square stays float32.
            let magnitude = (c.re as f32).hypot(c.im as f32);
            *p = magnitude * magnitude;
        }
    })
}

/// Features of an 8 kHz waveform through the original "fillzero" path: the 129-bin spectrum
/// loses its Nyquist bin and gains 129 zero bins, giving the 16 kHz bin spacing (31.25 Hz).
pub fn log_mel_8k_fillzero(wave: &[f32]) -> (Vec<f32>, usize) {
    extract(wave, WIN_8K, HOP_8K, FFT_8K, |spectrum, power| {
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

fn extract(
    wave: &[f32],
    win: usize,
    hop: usize,
    n_fft: usize,
    to_power: impl Fn(&[realfft::num_complex::Complex<f64>], &mut [f32]),
) -> (Vec<f32>, usize) {
    let frames = frame_count(wave.len(), win, hop);
    let window = hamming(win);
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(n_fft);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    let mut power = vec![0f32; N_BINS];
    let bank = mel::bank();
    let mut out = Vec::with_capacity(frames * N_MELS);
    for t in 0..frames {
        let frame = &wave[t * hop..t * hop + win];
        // Pre-emphasis inside the frame; the first sample is emphasised against itself.
        for i in 0..win {
            let prev = frame[i.saturating_sub(1)];
            let y = (frame[i] - PREEMPHASIS * prev) * 32768.0;
            input[i] = window[i] * f64::from(y);
        }
        input[win..].fill(0.0);
        fft.process_with_scratch(&mut input, &mut spectrum, &mut scratch)
            .expect("buffers come from the plan and have its sizes");
        to_power(&spectrum, &mut power);
        for (first, weights) in &bank.sparse {
            let energy: f32 = power[*first..*first + weights.len()]
                .iter()
                .zip(weights)
                .map(|(p, w)| p * w)
                .sum();
            out.push(energy.max(1.0).ln());
        }
    }
    (out, frames)
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

    #[test]
    fn hamming_is_symmetric_with_054_ends() {
        let w = hamming(400);
        assert!((w[0] - 0.08).abs() < 1e-15 && (w[399] - 0.08).abs() < 1e-15);
        assert!((w[10] - w[389]).abs() < 1e-15);
    }
}
