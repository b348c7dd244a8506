//! The original SpeechLib mel filterbank (`speechlib_mel(16000, 512, 80, fmin=0, fmax=7690)`).
//!
//! Not transformers' bank: that one gives FFT bin 246 a weight of 0.0097 in the last filter and
//! moves band 79 by up to 0.011 (fixture README §7). The reference features use this one.

use std::sync::OnceLock;

/// FFT bins of the 16 kHz layout (512-point real FFT).
pub const N_BINS: usize = 257;
const SAMPLE_RATE: f64 = 16000.0;
const N_FFT: f64 = 512.0;
const FMIN: f64 = 0.0;
const FMAX: f64 = 7690.0;

fn mel(f: f64) -> f64 {
    1127.0 * (1.0 + f / 700.0).ln()
}

fn bin_to_mel(bin: usize) -> f64 {
    1127.0 * (1.0 + bin as f64 * SAMPLE_RATE / (N_FFT * 700.0)).ln()
}

/// Python's `int(f * n_fft / sr + 0.5)` (truncation of a non-negative value).
fn freq_to_bin(f: f64) -> usize {
    (f * N_FFT / SAMPLE_RATE + 0.5) as usize
}

/// Weight of filter `m` (0..80) at FFT bin `k` (0..257), in float64, exactly as the original
/// evaluates it before storing float32.
pub fn weight_f64(m: usize, k: usize) -> f64 {
    let klo = freq_to_bin(FMIN) + 1;
    let khi = freq_to_bin(FMAX).max(klo);
    if k < klo || k >= khi {
        return 0.0;
    }
    let (mlo, mhi) = (mel(FMIN), mel(FMAX));
    let n_points = super::constants::N_MELS + 2;
    // numpy.linspace: start + i·step, with the last point set to `stop` exactly.
    let step = (mhi - mlo) / (n_points - 1) as f64;
    let point = |i: usize| {
        if i == n_points - 1 {
            mhi
        } else {
            mlo + i as f64 * step
        }
    };
    let spacing = (mhi - mlo) / (super::constants::N_MELS + 1) as f64;
    let (left, center, right) = (point(m), point(m + 1), point(m + 2));
    let mbin = bin_to_mel(k);
    if left < mbin && mbin < right {
        1.0 - (center - mbin).abs() / spacing
    } else {
        0.0
    }
}

/// The bank as float32, laid out `[257, 80]` (row = FFT bin), like the fixture's `mel_filters`,
/// plus for every filter the range of bins where it is non-zero (the bank is 97 % zeros, and
/// skipping them makes the mel product 30× cheaper).
pub struct MelBank {
    pub weights: Vec<f32>,
    /// Per filter: (first bin, weights over the bins first..first+len).
    pub sparse: Vec<(usize, Vec<f32>)>,
}

/// The shared bank (built once).
pub fn bank() -> &'static MelBank {
    static BANK: OnceLock<MelBank> = OnceLock::new();
    BANK.get_or_init(|| {
        let n = super::constants::N_MELS;
        let mut weights = vec![0f32; N_BINS * n];
        for k in 0..N_BINS {
            for m in 0..n {
                weights[k * n + m] = weight_f64(m, k) as f32;
            }
        }
        let sparse = (0..n)
            .map(|m| {
                let nonzero: Vec<usize> =
                    (0..N_BINS).filter(|&k| weights[k * n + m] != 0.0).collect();
                match (nonzero.first(), nonzero.last()) {
                    (Some(&a), Some(&b)) => (a, (a..=b).map(|k| weights[k * n + m]).collect()),
                    _ => (0, Vec::new()),
                }
            })
            .collect();
        MelBank { weights, sparse }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spot values from docs/phi4mm-model.md §6.4 (also pinned by the fixture manifest).
    #[test]
    fn spot_values_of_section_4_3() {
        assert!((weight_f64(0, 1) - 0.5756499911535635).abs() < 1e-15);
        // The doc's value and numpy's may differ by one ulp of the mel coordinate (6.6e-15).
        assert!((weight_f64(54, 100) - 0.6164795125445562).abs() < 1e-13);
        assert_eq!(weight_f64(79, 256), 0.0);
        assert_eq!(weight_f64(54, 100) as f32, 0.6164795125445562f64 as f32);
    }

    #[test]
    fn support_of_first_and_last_filter() {
        let nz = |m| {
            (0..N_BINS)
                .filter(|&k| weight_f64(m, k) != 0.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(nz(0), vec![1]);
        assert_eq!(nz(79), (231..=245).collect::<Vec<_>>());
        for k in [0, 246, 250, 256] {
            assert!(
                (0..80).all(|m| weight_f64(m, k) == 0.0),
                "bin {k} must be empty"
            );
        }
    }
}
