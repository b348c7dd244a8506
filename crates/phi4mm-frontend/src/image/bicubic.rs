//! The global crop: PyTorch `interpolate(mode="bicubic", align_corners=False)` without antialias,
//! in float32 (docs/phi4mm-model.md §8.5).

use rayon::prelude::*;

/// Resizes planar `[channels, in_h, in_w]` float32 to `[channels, out_h, out_w]`.
pub fn resize_chw(
    src: &[f32],
    channels: usize,
    in_h: usize,
    in_w: usize,
    out_h: usize,
    out_w: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; channels * out_h * out_w];
    let sample = |c: usize, y: usize, x: usize| src[(c * in_h + y) * in_w + x];
    resize(sample, channels, (in_h, in_w), (out_h, out_w), &mut out);
    out
}

/// Resizes interleaved RGB8 `[in_h, in_w, 3]`, each byte first mapped through `normalise` (the
/// float value the reference resizes), into planar `out` `[3, out_h, out_w]`: the same floats as
/// [`resize_chw`] of the normalised planes, without materialising them.
pub fn resize_rgb8_normalised(
    rgb: &[u8],
    normalise: &[f32; 256],
    (in_h, in_w): (usize, usize),
    (out_h, out_w): (usize, usize),
    out: &mut [f32],
) {
    let sample = |c: usize, y: usize, x: usize| normalise[usize::from(rgb[(y * in_w + x) * 3 + c])];
    resize(sample, 3, (in_h, in_w), (out_h, out_w), out);
}

/// PyTorch's CPU kernel computes, per output pixel, `Σ_y w_y · (Σ_x w_x · src[y][x])` (height
/// outer, width inner, taps accumulated in order), with indices and weights in float32. The
/// inner sums depend only on (source row, output column), so a horizontal pass followed by a
/// vertical pass performs exactly the same float operations in the same order, at a fraction of
/// the cost. Both passes split by rows over the caller's rayon pool; every value is computed as
/// it would be alone.
fn resize(
    sample: impl Fn(usize, usize, usize) -> f32 + Sync,
    channels: usize,
    (in_h, in_w): (usize, usize),
    (out_h, out_w): (usize, usize),
    out: &mut [f32],
) {
    assert_eq!(out.len(), channels * out_h * out_w, "output size");
    if in_h == out_h && in_w == out_w {
        // Scale 1: taps (0, 1, 0, 0), the identity.
        for (i, v) in out.iter_mut().enumerate() {
            let (c, rest) = (i / (out_h * out_w), i % (out_h * out_w));
            *v = sample(c, rest / out_w, rest % out_w);
        }
        return;
    }
    let taps_x = taps(in_w, out_w);
    let taps_y = taps(in_h, out_h);
    let select_x: Option<Vec<usize>> = taps_x
        .iter()
        .map(|(idx, w)| (*w == SELECT).then_some(idx[1]))
        .collect();
    // Horizontal pass: `rows[y][c][x]`, one source row (all channels) per task.
    let mut rows = vec![0f32; in_h * channels * out_w];
    rows.par_chunks_mut(channels * out_w)
        .enumerate()
        .for_each(|(y, row)| {
            for (c, line) in row.chunks_exact_mut(out_w).enumerate() {
                match &select_x {
                    Some(source) => {
                        for (v, &x) in line.iter_mut().zip(source) {
                            *v = sample(c, y, x);
                        }
                    }
                    None => horizontal(line, &taps_x, |x| sample(c, y, x)),
                }
            }
        });
    // Vertical pass: one output row of one channel per task; contiguous in x, so it vectorises.
    out.par_chunks_mut(out_w).enumerate().for_each(|(i, line)| {
        let (c, y) = (i / out_h, i % out_h);
        let (idx, w) = &taps_y[y];
        let src = |k: usize| &rows[(idx[k] * channels + c) * out_w..][..out_w];
        vertical(line, [src(0), src(1), src(2), src(3)], w);
    });
}

/// One row of one channel of the horizontal pass: `value(x)` is the source pixel at column x.
fn horizontal(line: &mut [f32], taps: &[Taps], value: impl Fn(usize) -> f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() {
        // SAFETY: the CPU supports the features `horizontal_fma` is compiled for.
        return unsafe { horizontal_fma(line, taps, value) };
    }
    horizontal_body(line, taps, value);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn horizontal_fma(line: &mut [f32], taps: &[Taps], value: impl Fn(usize) -> f32) {
    horizontal_body(line, taps, value);
}

#[inline(always)]
fn horizontal_body(line: &mut [f32], taps: &[Taps], value: impl Fn(usize) -> f32) {
    for (v, (idx, w)) in line.iter_mut().zip(taps) {
        *v = dot4(|k| value(idx[k]), w);
    }
}

/// One output row of the vertical pass, with hardware FMA where the CPU has it.
fn vertical(line: &mut [f32], src: [&[f32]; 4], w: &[f32; 4]) {
    if *w == SELECT {
        return line.copy_from_slice(src[1]);
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() {
        // SAFETY: the CPU supports the features `vertical_fma` is compiled for.
        return unsafe { vertical_fma(line, src, w) };
    }
    vertical_body(line, src, w);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn vertical_fma(line: &mut [f32], src: [&[f32]; 4], w: &[f32; 4]) {
    vertical_body(line, src, w);
}

/// `mul_add` is exactly rounded on every path (an instruction or libm's `fmaf`), so the
/// dispatch changes speed only.
#[inline(always)]
fn vertical_body(line: &mut [f32], src: [&[f32]; 4], w: &[f32; 4]) {
    let [s0, s1, s2, s3] = src;
    for ((((v, &a), &b), &c), &d) in line.iter_mut().zip(s0).zip(s1).zip(s2).zip(s3) {
        *v = d.mul_add(w[3], c.mul_add(w[2], b.mul_add(w[1], a * w[0])));
    }
}

/// `t0·w0 + t1·w1 + t2·w2 + t3·w3`, accumulated left to right in float32 with fused
/// multiply-adds (PyTorch's kernels are built by GCC with FMA and `-ffp-contract=fast`). Measured
/// on the fixture bands: 1.2e-7 max abs from the reference with FMA, 1.8e-7 without; neither is
/// bit-exact (the reference's sha256 of the full global image is not reproduced), far inside the
/// 1e-5 acceptance.
#[inline(always)]
fn dot4(value: impl Fn(usize) -> f32, w: &[f32; 4]) -> f32 {
    let mut acc = value(0) * w[0];
    for (k, &wk) in w.iter().enumerate().skip(1) {
        acc = value(k).mul_add(wk, acc);
    }
    acc
}

/// The four border-clamped source indices of one output index and their cubic weights.
type Taps = ([usize; 4], [f32; 4]);

/// The weights of an output that falls exactly on its second source sample (`t = 0`, as every
/// output does when the scale is an odd integer: the global image of a grid with 1 or 3 crops
/// along that axis). The four-tap sum is then that sample itself, `0·a + b + 0·c + 0·d = b`
/// (exactly, for finite samples; only a zero's sign could differ), so it is read, not summed.
const SELECT: [f32; 4] = [0.0, 1.0, 0.0, 0.0];

/// Per output index: its [`Taps`].
fn taps(in_size: usize, out_size: usize) -> Vec<Taps> {
    const A: f32 = -0.75;
    let scale = in_size as f32 / out_size as f32;
    (0..out_size)
        .map(|i| {
            // area_pixel_compute_source_index (cubic: not clamped at 0).
            let real = scale * (i as f32 + 0.5) - 0.5;
            let floor = real.floor();
            let index = (floor as i64).min(in_size as i64 - 1);
            let t = (real - index as f32).clamp(0.0, 1.0);
            let conv1 = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
            let conv2 = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
            let x2 = 1.0 - t;
            let weights = [conv2(t + 1.0), conv1(t), conv1(x2), conv2(x2 + 1.0)];
            let clamp = |k: i64| (index - 1 + k).clamp(0, in_size as i64 - 1) as usize;
            ([clamp(0), clamp(1), clamp(2), clamp(3)], weights)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused path (bytes through the table) gives the floats of the planar path on the
    /// table's planes, bit for bit, for a downscale, an upscale and the identity.
    #[test]
    fn fused_rgb8_equals_planar() {
        let normalise: [f32; 256] = std::array::from_fn(|v| (v as f32 - 127.5) / 127.5);
        let (h, w) = (37, 53);
        let rgb: Vec<u8> = (0..h * w * 3).map(|i| (i * 7919 % 251) as u8).collect();
        let planar: Vec<f32> = (0..3)
            .flat_map(|c| (0..h * w).map(move |i| (c, i)))
            .map(|(c, i)| normalise[usize::from(rgb[i * 3 + c])])
            .collect();
        for (oh, ow) in [(16, 20), (80, 101), (h, w)] {
            let want = resize_chw(&planar, 3, h, w, oh, ow);
            let mut got = vec![0f32; 3 * oh * ow];
            resize_rgb8_normalised(&rgb, &normalise, (h, w), (oh, ow), &mut got);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{oh}x{ow}"
            );
        }
    }

    /// Where every output falls on a source sample (scale 3 across, as for a grid three crops
    /// wide; scale 1 down), the taps are [`SELECT`] and the resize reads those samples: the
    /// same floats as the full four-tap sums in both passes.
    #[test]
    fn selected_samples_equal_the_four_tap_sums() {
        let (channels, in_h, in_w, out_h, out_w) = (2, 9, 1344, 9, 448);
        let src: Vec<f32> = (0..channels * in_h * in_w)
            .map(|i| ((i * 7919) % 509) as f32 / 254.5 - 1.0)
            .collect();
        let (taps_x, taps_y) = (taps(in_w, out_w), taps(in_h, out_h));
        assert!(taps_x.iter().chain(&taps_y).all(|(_, w)| *w == SELECT));
        let mut want = vec![0f32; channels * out_h * out_w];
        for (i, line) in want.chunks_exact_mut(out_w).enumerate() {
            let (c, y) = (i / out_h, i % out_h);
            let row = |sy: usize| -> Vec<f32> {
                let mut r = vec![0f32; out_w];
                horizontal_body(&mut r, &taps_x, |x| src[(c * in_h + sy) * in_w + x]);
                r
            };
            let (idx, w) = &taps_y[y];
            let rows = idx.map(row);
            vertical_body(line, [&rows[0], &rows[1], &rows[2], &rows[3]], w);
        }
        let got = resize_chw(&src, channels, in_h, in_w, out_h, out_w);
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    /// The dispatched passes equal the portable ones bit for bit.
    #[test]
    fn vertical_paths_agree() {
        let rows: Vec<Vec<f32>> = (0..4)
            .map(|k| {
                (0..203)
                    .map(|x| ((x * 31 + k * 17) % 97) as f32 / 7.3 - 6.0)
                    .collect()
            })
            .collect();
        let w = [-0.0703125, 0.8671875, 0.2265625, -0.0234375];
        let src = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
        let mut fast = vec![0f32; 203];
        let mut portable = vec![0f32; 203];
        vertical(&mut fast, src, &w);
        vertical_body(&mut portable, src, &w);
        assert_eq!(fast, portable);
        let taps = taps(203, 71);
        let (mut fast, mut portable) = (vec![0f32; 71], vec![0f32; 71]);
        horizontal(&mut fast, &taps, |x| rows[1][x]);
        horizontal_body(&mut portable, &taps, |x| rows[1][x]);
        assert_eq!(fast, portable);
    }
}
