//! Sampling-rate handling: SciPy-equal polyphase resampling and the original code's rate rules.

use super::resample_mode::ResampleMode;
use rayon::prelude::*;

/// Which spectrum recipe the prepared waveform goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpectrumPath {
    /// 400-sample windows, hop 160, 512-point FFT (docs/phi4mm-model.md §6.3).
    Wideband16k,
    /// The original's 8 kHz "fillzero" path: 200/80/256 and zero upper bins
    /// (docs/phi4mm-model.md §6.5).
    FillZero8k,
}

/// Waveform ready for feature extraction: float32, as the reference casts it before framing.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    pub waveform: Vec<f32>,
    pub path: SpectrumPath,
}

/// Applies the rate rule of `mode` to a validated clip (8 kHz ≤ `fs` ≤ 384 kHz, finite samples).
pub fn prepare(samples: &[f64], fs: u32, mode: ResampleMode) -> Prepared {
    let to_f32 = |v: Vec<f64>| cast_f32(&v);
    match mode {
        ResampleMode::Polyphase => {
            let waveform = if fs == 16000 {
                cast_f32(samples)
            } else {
                let g = gcd(16000, fs as usize);
                to_f32(resample_poly(samples, 16000 / g, fs as usize / g))
            };
            Prepared {
                waveform,
                path: SpectrumPath::Wideband16k,
            }
        }
        // processing_phi4mm.py: `if fs > 16000: resample_poly(wav, 1, fs // 16000); fs = 16000`,
        // `elif 8000 < fs < 16000: resample_poly(wav, 1, fs // 8000); fs = 8000` (always 1/1),
        // `fs == 8000` is used as is. The integer divisions are the point of this mode.
        ResampleMode::Reference => {
            if fs > 16000 {
                let down = fs as usize / 16000;
                Prepared {
                    waveform: to_f32(resample_poly(samples, 1, down)),
                    path: SpectrumPath::Wideband16k,
                }
            } else if fs == 16000 {
                Prepared {
                    waveform: cast_f32(samples),
                    path: SpectrumPath::Wideband16k,
                }
            } else {
                Prepared {
                    waveform: cast_f32(samples),
                    path: SpectrumPath::FillZero8k,
                }
            }
        }
    }
}

/// The reference's cast to float32, over the caller's rayon pool (a 30 s clip is 480,000 samples).
fn cast_f32(samples: &[f64]) -> Vec<f32> {
    // A plain loop per block vectorises; a per-sample `map` through the pool's collector did not.
    crate::parallel::par_fill(samples.len(), |first, out| {
        let pairs = out.iter_mut().zip(&samples[first..]);
        pairs.map(|(o, &x)| o.write(x as f32)).count()
    })
}

/// Length of the FIR filter [`prepare`] designs for a clip at `fs` Hz in `mode` (0 when the clip
/// is not resampled): `2·10·max(up, down) + 1` taps for the reduced ratio `up/down`, as
/// [`resample_poly`] builds it. The cost of the design and the filter's memory grow with it, so
/// the caller bounds it (`max_resample_filter_taps`) from the header's rate before decoding.
/// Common rates need at most 12,801 taps (11,025 Hz: 640/441); a rate coprime to 16000 needs
/// `20·fs + 1` (44,101 Hz: 882,021).
pub fn filter_taps(fs: u32, mode: ResampleMode) -> usize {
    let (up, down) = match mode {
        ResampleMode::Polyphase => {
            let g = gcd(16000, fs as usize);
            if g == 0 {
                return 0;
            }
            (16000 / g, fs as usize / g)
        }
        ResampleMode::Reference if fs > 16000 => (1, fs as usize / 16000),
        ResampleMode::Reference => (1, 1),
    };
    if up == down {
        0
    } else {
        2 * 10 * up.max(down) + 1
    }
}

/// Greatest common divisor.
pub fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `scipy.signal.resample_poly(x, up, down)` with the default window `('kaiser', 5.0)` and
/// `padtype='constant'` (zeros), computed in float64.
///
/// SciPy designs `h = firwin(2·half_len + 1, 1/max_rate, window) · up` with
/// `half_len = 10·max_rate`, prepends `down − half_len % down` zeros so output samples sit at the
/// filter centre, runs `upfirdn` and keeps `ceil(n·up/down)` samples after dropping
/// `(half_len + pre_pad) // down`. Each output is evaluated directly as a polyphase dot product
/// (only every `up`-th tap meets a real input sample), which is the same sum without the zeros.
pub fn resample_poly(x: &[f64], up: usize, down: usize) -> Vec<f64> {
    let g = gcd(up, down);
    let (up, down) = (up / g, down / g);
    if (up == 1 && down == 1) || x.is_empty() {
        return x.to_vec();
    }
    let n_in = x.len();
    let n_out = (n_in * up).div_ceil(down);
    let max_rate = up.max(down);
    let half_len = 10 * max_rate;
    let mut h = firwin_kaiser(2 * half_len + 1, 1.0 / max_rate as f64, 5.0);
    for v in &mut h {
        *v *= up as f64;
    }
    let pre_pad = down - half_len % down;
    let pre_remove = (half_len + pre_pad) / down;
    // Padded filter index k maps to h[k - pre_pad]; post padding only adds zeros.
    let taps = h.len();
    let output = |i: usize| -> f64 {
        let m = i * down; // index into the full-rate (upsampled) convolution
                          // Padded taps k ≡ m (mod up) meet input x[(m − k) / up]; walk k upwards (the order of
                          // SciPy's sum) while the input index walks downwards, without a division per tap.
        let mut k = m % up;
        let mut j = m / up;
        if j >= n_in {
            let skip = j - (n_in - 1);
            k += skip * up;
            j -= skip;
        }
        if k < pre_pad {
            let skip = (pre_pad - k).div_ceil(up);
            if skip > j {
                return 0.0;
            }
            k += skip * up;
            j -= skip;
        }
        let first = k - pre_pad;
        let count = if first < taps {
            (taps - first).div_ceil(up).min(j + 1)
        } else {
            0
        };
        h[first..]
            .iter()
            .step_by(up)
            .take(count)
            .zip(x[..=j].iter().rev())
            .fold(0.0, |acc, (hk, xj)| acc + hk * xj)
    };
    // Outputs are independent: blocks of them go to the caller's rayon pool, each computed
    // exactly as alone.
    const OUTPUTS_PER_TASK: usize = 8192;
    let mut y = vec![0.0; n_out];
    y.par_chunks_mut(OUTPUTS_PER_TASK)
        .enumerate()
        .for_each(|(block, chunk)| {
            let base = pre_remove + block * OUTPUTS_PER_TASK;
            for (offset, v) in chunk.iter_mut().enumerate() {
                *v = output(base + offset);
            }
        });
    y
}

/// `scipy.signal.firwin(numtaps, cutoff, window=('kaiser', beta))`: low-pass, cutoff relative to
/// Nyquist, scaled to unit gain at DC.
fn firwin_kaiser(numtaps: usize, cutoff: f64, beta: f64) -> Vec<f64> {
    let alpha = 0.5 * (numtaps as f64 - 1.0);
    let i0_beta = bessel_i0(beta);
    let mut h: Vec<f64> = (0..numtaps)
        .map(|n| {
            let m = n as f64 - alpha;
            let ideal = cutoff * sinc(cutoff * m);
            let r = (n as f64 - alpha) / alpha;
            let window = bessel_i0(beta * (1.0 - r * r).max(0.0).sqrt()) / i0_beta;
            ideal * window
        })
        .collect();
    let sum: f64 = h.iter().sum();
    for v in &mut h {
        *v /= sum;
    }
    h
}

/// numpy's `sinc`: sin(πx)/(πx), 1 at 0.
fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let y = std::f64::consts::PI * x;
        y.sin() / y
    }
}

/// Modified Bessel function of the first kind, order 0, by its power series
/// Σ ((x/2)^k / k!)²; for the arguments used here (≤ 5) it converges to full double precision
/// in about 30 terms.
pub(crate) fn bessel_i0(x: f64) -> f64 {
    let q = 0.25 * x * x;
    let mut term = 1.0;
    let mut sum = 1.0;
    for k in 1..200 {
        term *= q / (k as f64 * k as f64);
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bessel_i0_known_values() {
        // Abramowitz & Stegun table 9.8: I0(1) = 1.266065878, I0(5) = 27.23987182.
        assert!((bessel_i0(1.0) - 1.2660658777520082).abs() < 1e-14);
        assert!((bessel_i0(5.0) - 27.239871823604442).abs() < 1e-12);
    }

    #[test]
    fn empty_input_gives_empty_output() {
        assert!(resample_poly(&[], 2, 1).is_empty());
    }

    #[test]
    fn identity_ratio_is_a_copy() {
        let x = [0.1, -0.2, 0.3];
        assert_eq!(resample_poly(&x, 3, 3), x.to_vec());
    }

    #[test]
    fn filter_taps_of_common_and_odd_rates() {
        let polyphase = |fs| filter_taps(fs, ResampleMode::Polyphase);
        assert_eq!(polyphase(16000), 0);
        assert_eq!(polyphase(8000), 41);
        assert_eq!(polyphase(48000), 61);
        assert_eq!(polyphase(44100), 8821);
        assert_eq!(polyphase(11025), 12801);
        assert_eq!(polyphase(384_000), 481);
        assert_eq!(polyphase(44101), 882_021);
        assert_eq!(polyphase(383_999), 7_679_981);
        // Reference mode decimates by an integer (24 kHz is only relabelled).
        assert_eq!(filter_taps(44100, ResampleMode::Reference), 41);
        assert_eq!(filter_taps(24000, ResampleMode::Reference), 0);
        assert_eq!(filter_taps(12000, ResampleMode::Reference), 0);
        // The longest filter any common rate needs is 11,025 Hz's.
        let mut common = 0;
        for fs in [
            8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000,
            176_400, 192_000, 352_800, 384_000,
        ] {
            common = common.max(polyphase(fs));
        }
        assert_eq!(common, 12801);
    }

    #[test]
    fn output_lengths_follow_scipy() {
        let x = vec![0.0; 13274];
        assert_eq!(resample_poly(&x, 2, 1).len(), 26548);
        let x = vec![0.0; 61265];
        assert_eq!(resample_poly(&x, 160, 441).len(), 22228);
        assert_eq!(resample_poly(&x, 1, 2).len(), 30633);
    }
}
