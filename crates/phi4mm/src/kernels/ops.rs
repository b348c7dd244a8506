//! Element-wise and normalisation ops, in f32 with the reference's operation order.

use rayon::prelude::*;

use super::path::KernelPath;

/// RMSNorm (T5 style): `w * (x / sqrt(mean(x²) + eps))`, per row of width `w.len()`.
/// Rows in parallel (a prefill normalises hundreds of rows twice per layer).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let d = w.len();
    let mut out = vec![0.0; x.len()];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(or, xr)| {
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
                *o = g * (v * inv);
            }
        });
    out
}

/// LayerNorm with weight and bias, per row of width `w.len()`.
/// Rows in parallel, as [`rms_norm`].
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let d = w.len();
    let mut out = vec![0.0; x.len()];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(or, xr)| {
            let mean = xr.iter().sum::<f32>() / d as f32;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for (((o, v), g), bb) in or.iter_mut().zip(xr).zip(w).zip(b) {
                *o = (v - mean) * inv * g + bb;
            }
        });
    out
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU / swish: `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`, SigLIP).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi), rounded to f32 as torch does
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// [`gelu_tanh`] of every element, in parallel, with the exponentials of [`exp_in_place`]
/// (sixteen at a time on AVX-512) instead of a scalar `tanh` each: the real SigLIP MLP takes
/// 4.4 million per layer and crop. Computed as `x · sigmoid(2u)`, u = √(2/π)·(x + 0.044715·x³),
/// which equals `0.5·x·(1 + tanh u)` (since 1 + tanh u = 2 / (1 + e^(−2u))) and avoids the
/// cancellation of `1 + tanh u` where tanh u nears −1.
pub fn gelu_tanh_in_place(v: &mut [f32]) {
    const C: f32 = 0.797_884_6; // as in `gelu_tanh`
    const CHUNK: usize = 1024;
    v.par_chunks_mut(CHUNK).for_each(|chunk| {
        let mut e = [0f32; CHUNK];
        let e = &mut e[..chunk.len()];
        for (t, &x) in e.iter_mut().zip(chunk.iter()) {
            *t = -2.0 * (C * (x + 0.044715 * x * x * x));
        }
        exp_in_place(e);
        for (x, t) in chunk.iter_mut().zip(e.iter()) {
            *x /= 1.0 + t;
        }
    });
}

/// GELU, exact erf form (the projections).
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    (0.5 * x as f64 * (1.0 + libm::erf(x as f64 / std::f64::consts::SQRT_2))) as f32
}

/// `v[i] = e^v[i]`. On the AVX-512 path sixteen at a time (within 2 ulp of `f32::exp`); on the
/// others `f32::exp` itself.
pub fn exp_in_place(v: &mut [f32]) {
    exp_in_place_on(super::path::active(), v)
}

fn exp_in_place_on(path: KernelPath, v: &mut [f32]) {
    assert!(path.supported(), "kernel path {path} not supported");
    #[cfg(target_arch = "x86_64")]
    if path.vector() == KernelPath::Avx512 {
        // SAFETY: the CPU supports AVX-512 (asserted above).
        unsafe { super::avx512::exp_in_place_avx512(v) };
        return;
    }
    for x in v {
        *x = x.exp();
    }
}

/// `out[i] = up[i] · silu(gate[i])`, the gated MLP's activation, with [`silu`]'s operation order
/// and the exponentials of [`exp_in_place`].
pub fn silu_gated(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == out.len() && up.len() == out.len(),
        "silu_gated: lengths"
    );
    for (o, g) in out.iter_mut().zip(gate) {
        *o = -g;
    }
    exp_in_place(out);
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = u * (g * (1.0 / (1.0 + *o)));
    }
}

/// In-place softmax of one row. The maximum and the sum run over sixteen lanes at once (so the
/// compiler vectorises them: a vision crop's attention takes a million rows of 1,025), which
/// sums in a different order from a single running sum, within f32 rounding.
pub fn softmax(row: &mut [f32]) {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut blocks = row.chunks_exact(LANES);
    for b in &mut blocks {
        for (m, &v) in lanes.iter_mut().zip(b) {
            // As `f32::max`: a NaN never wins.
            *m = if v > *m { v } else { *m };
        }
    }
    let max = blocks
        .remainder()
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    for v in row.iter_mut() {
        *v -= max;
    }
    exp_in_place(row);
    let mut lanes = [0f32; LANES];
    let mut blocks = row.chunks_exact(LANES);
    for b in &mut blocks {
        for (s, &v) in lanes.iter_mut().zip(b) {
            *s += v;
        }
    }
    let sum: f32 = lanes.iter().sum::<f32>() + blocks.remainder().iter().sum::<f32>();
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `x += s · y`
pub fn add_scaled(x: &mut [f32], y: &[f32], s: f32) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += s * b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::path;

    /// Distance in units in the last place between two finite f32 of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    /// The exponential on every kernel path this CPU has: within 2 ulp of the correctly rounded
    /// value over the normal range (an odd length, so the masked tail runs too), 0 below the
    /// subnormals and for -inf, +inf past the top and for +inf, NaN for NaN, exactly 1 at 0.
    #[test]
    fn exp_matches_the_rounded_exponential_on_every_path() {
        for p in KernelPath::ALL {
            if !path::supported_or_report(p, "exp test") {
                continue;
            }
            let exp_in_place = |v: &mut [f32]| exp_in_place_on(p, v);
            let xs: Vec<f32> = (0..200_001).map(|i| -87.0 + i as f32 * 175.5e-5).collect();
            let mut got = xs.clone();
            exp_in_place(&mut got);
            for (x, g) in xs.iter().zip(&got) {
                let want = (*x as f64).exp() as f32;
                assert!(ulps(*g, want) <= 2, "{p}: exp({x}) = {g}, want {want}");
            }
            let mut special = [
                0.0,
                -0.0,
                f32::NEG_INFINITY,
                -200.0,
                -104.0,
                89.0,
                200.0,
                f32::INFINITY,
                f32::NAN,
            ];
            exp_in_place(&mut special);
            assert_eq!(
                &special[..8],
                &[
                    1.0,
                    1.0,
                    0.0,
                    0.0,
                    0.0,
                    f32::INFINITY,
                    f32::INFINITY,
                    f32::INFINITY
                ],
                "{p}"
            );
            assert!(special[8].is_nan(), "{p}");
            // The subnormal range: absolute error within one subnormal step.
            let mut tiny: Vec<f32> = (0..1000).map(|i| -103.0 + i as f32 * 0.015).collect();
            let xs = tiny.clone();
            exp_in_place(&mut tiny);
            for (x, g) in xs.iter().zip(&tiny) {
                let want = (*x as f64).exp();
                assert!(
                    (*g as f64 - want).abs() <= 1.5e-45,
                    "{p}: exp({x}) = {g:e}, want {want:e}"
                );
            }
        }
        path::force(None).unwrap();
    }

    /// The vectorised GELU against an f64 evaluation of its definition, `0.5·x·(1 + tanh u)`,
    /// over the range activations take and past it (saturation on both sides), on the detected
    /// path: within 2e-7 absolute plus 4 ulp-sized relative.
    #[test]
    fn gelu_tanh_in_place_matches_its_definition() {
        let xs: Vec<f32> = (0..20_011).map(|i| -30.0 + i as f32 * 3e-3).collect();
        let mut got = xs.clone();
        gelu_tanh_in_place(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let x64 = x as f64;
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3));
            let want = 0.5 * x64 * (1.0 + u.tanh());
            assert!(
                (g as f64 - want).abs() <= 2e-7 + 5e-7 * want.abs(),
                "gelu_tanh({x}) = {g}, want {want}"
            );
            // And the scalar form the reference writes.
            assert!((g - gelu_tanh(x)).abs() <= 2e-7 + 5e-7 * g.abs(), "{x}");
        }
    }

    /// The gated activation and the softmax (on the detected path) against their definitions.
    #[test]
    fn silu_gated_and_softmax_match_their_definitions() {
        let gate: Vec<f32> = (0..1037).map(|i| (i as f32 * 0.37).sin() * 30.0).collect();
        let up: Vec<f32> = (0..1037).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut logits: Vec<f32> = (0..301).map(|i| (i as f32 * 0.7).sin() * 12.0).collect();
        logits[7] = f32::NEG_INFINITY;
        {
            let p = path::active();
            let mut out = vec![0.0; gate.len()];
            silu_gated(&gate, &up, &mut out);
            for ((o, g), u) in out.iter().zip(&gate).zip(&up) {
                let want = u * silu(*g);
                assert!(
                    (o - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{p}: {o} vs {want}"
                );
            }
            let mut row = logits.clone();
            softmax(&mut row);
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = logits.iter().map(|l| (*l as f64 - max).exp()).sum();
            for (r, l) in row.iter().zip(&logits) {
                let want = (*l as f64 - max).exp() / sum;
                assert!(
                    (*r as f64 - want).abs() <= 1e-6 * want.max(1e-3),
                    "{p}: {r} vs {want}"
                );
            }
            assert_eq!(row[7], 0.0);
        }
    }
}
