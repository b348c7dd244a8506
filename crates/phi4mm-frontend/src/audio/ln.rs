//! The natural logarithm of the mel energies, in a form the compiler vectorises.
//!
//! A 30 s clip takes 240,000 logarithms (80 per frame). Called one at a time, libm's `logf` was a
//! fifth of the log-mel time. This one is branch-free plain arithmetic on the float64 bits, so a
//! loop over a frame's 80 energies becomes vector code, and it is evaluated in float64 and
//! rounded once to float32. Its float64 value is within 1e-15 (relative) of the true logarithm,
//! so the float32 it returns is the correctly rounded one, except where the logarithm lies within
//! about 1e-15 of a midpoint between two float32s. libm's `logf` is accurate to 0.82 ulp, numpy's
//! vectorised `log` to a few ulp; neither is closer to the reference's float64 values.

/// `ln(2)` in float64.
const LN_2: f64 = std::f64::consts::LN_2;
/// The bits of `√½`: subtracting them splits `x = 2^k · z` with `z` in `[√½, √2)`.
const SQRT_HALF_BITS: u64 = 0x3fe6_a09e_667f_3bcd;
/// `1/(2n+1)` for n = 1..=9: the series of `atanh`, which with `|s| ≤ 0.1716` is truncated
/// below 3e-17 relative after the `s¹⁹` term.
const ATANH_SERIES: [f64; 9] = [
    1.0 / 3.0,
    1.0 / 5.0,
    1.0 / 7.0,
    1.0 / 9.0,
    1.0 / 11.0,
    1.0 / 13.0,
    1.0 / 15.0,
    1.0 / 17.0,
    1.0 / 19.0,
];

/// `ln(x)` in float64 for a positive, finite, normal `x`.
///
/// `x = 2^k · z` with `z` in `[√½, √2)`, so `ln x = k·ln 2 + ln z`, and
/// `ln z = 2·atanh(s)` with `s = (z − 1)/(z + 1)`, `|s| ≤ 0.1716`.
#[inline(always)]
pub fn ln_f64(x: f64) -> f64 {
    let bits = x.to_bits();
    let offset = bits.wrapping_sub(SQRT_HALF_BITS);
    // The arithmetic shift keeps the sign of k for x below √½.
    let k = (offset as i64) >> 52;
    let z = f64::from_bits(bits.wrapping_sub(offset & (0xfff << 52)));
    let f = z - 1.0;
    let s = f / (2.0 + f);
    let w = s * s;
    let mut series = ATANH_SERIES[8];
    for &c in ATANH_SERIES[..8].iter().rev() {
        series = series * w + c;
    }
    let ln_z = 2.0 * s + 2.0 * s * (w * series);
    k as f64 * LN_2 + ln_z
}

/// Replaces each energy `e` (finite and ≥ 1: the features floor them at 1) by `ln e`.
#[inline(always)]
pub fn ln_in_place(energies: &mut [f32]) {
    for e in energies {
        *e = ln_f64(f64::from(*e)) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the standard library's float64 `ln` over the energies' whole range (1 to 1e17,
    /// log-uniform) and around the split at √2: within 1e-15 relative in float64, and the same
    /// float32 after rounding.
    #[test]
    fn matches_ln_to_float64_precision() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let near_split =
            (0..20_000).map(|i| std::f64::consts::SQRT_2 * (1.0 + (i as f64 - 1e4) * 1e-9));
        let energies = (0..1_000_000).map(|_| 10f64.powf(17.0 * next()));
        let powers_of_two = (0..57).map(|k| 2f64.powi(k));
        for x in near_split
            .chain(energies)
            .chain(powers_of_two)
            .chain([1.0, 1.5, 1e17])
        {
            let x = f64::from(x as f32);
            let (got, want) = (ln_f64(x), x.ln());
            assert!(
                (got - want).abs() <= 1e-15 * want.abs().max(1e-300) || got == want,
                "ln({x:e}) = {got:e}, want {want:e}"
            );
            assert_eq!((got as f32).to_bits(), (want as f32).to_bits(), "ln({x:e})");
        }
        assert_eq!(ln_f64(1.0), 0.0);
    }

    /// Below 1 too (not what the features use, but the split must hold there as well).
    #[test]
    fn holds_below_one() {
        for x in [1e-30, 0.001, 0.5, 0.70710677, 0.9999999] {
            let x = f64::from(x as f32);
            assert!((ln_f64(x) - x.ln()).abs() <= 1e-15 * x.ln().abs(), "{x:e}");
        }
    }
}
