//! Linear layers over weights kept in their on-disk precision.
//!
//! Two paths, both computing f32 sums of the stored weights and the f32 inputs:
//! - few rows (decode): a multithreaded GEMV that streams each weight row once from memory and
//!   dots it against every input row (AVX2+FMA when the CPU has it). Decode is memory-bound, so
//!   reading half the bytes of f32 is the whole game.
//! - many rows (prefill, encoders): a tiled GEMM, tiles spread over the rayon pool. On the AVX-512
//!   path, register blocks of dot products read the bf16 weights where they lie; on the AMX path,
//!   tile products read them there too, against the inputs split exactly into bf16 parts; on the
//!   others each weight tile is widened to f32 and multiplied with `matrixmultiply::sgemm`.

use rayon::prelude::*;

use super::path::KernelPath;
use crate::checkpoint::{TensorView, WeightData};

/// Up to this many input rows use the GEMV path (each weight byte is read once per call).
pub const GEMV_MAX_ROWS: usize = 8;

/// A `[out, in]` weight matrix (PyTorch layout) viewed in its stored precision.
#[derive(Clone, Copy)]
pub struct Matrix<'a> {
    pub data: WeightData<'a>,
    pub out_dim: usize,
    pub in_dim: usize,
}

impl<'a> Matrix<'a> {
    /// Views a tensor whose first dimension is `out` and the rest flatten to `in`.
    pub fn of(t: &'a TensorView) -> Self {
        let out_dim = t.shape[0];
        let in_dim = t.numel() / out_dim.max(1);
        Matrix {
            data: t.data(),
            out_dim,
            in_dim,
        }
    }

    /// Rows `[start, start + n)` as a smaller matrix.
    pub fn rows(&self, start: usize, n: usize) -> Matrix<'a> {
        let (a, b) = (start * self.in_dim, (start + n) * self.in_dim);
        let data = match self.data {
            WeightData::Bf16(s) => WeightData::Bf16(&s[a..b]),
            WeightData::F16(s) => WeightData::F16(&s[a..b]),
            WeightData::F32(s) => WeightData::F32(&s[a..b]),
        };
        Matrix {
            data,
            out_dim: n,
            in_dim: self.in_dim,
        }
    }
}

/// Raw pointer that may cross threads; every user writes a disjoint region.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: each `SendPtr` comes from a `&mut` output buffer that stays borrowed until the
// parallel loop using it has returned, and the loop's tasks write disjoint indices, so handing
// it to other threads cannot race or outlive the buffer.
unsafe impl Send for SendPtr {}
// SAFETY: as for `Send`: concurrent users write disjoint elements and never read each other's.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// Method access makes closures capture the whole (Send) wrapper, not the raw field.
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// `y[r, :] = W · x[r, :] (+ bias)` for `rows` input rows; `x` is `[rows, in]`, `y` `[rows, out]`.
pub fn linear(x: &[f32], rows: usize, w: Matrix, bias: Option<&[f32]>, y: &mut [f32]) {
    assert_eq!(x.len(), rows * w.in_dim, "linear: input size");
    assert_eq!(y.len(), rows * w.out_dim, "linear: output size");
    if rows == 0 {
        return;
    }
    if rows <= GEMV_MAX_ROWS {
        gemv(x, rows, w, y, Store::Set);
    } else {
        gemm_tiled(x, rows, w, y);
    }
    if let Some(b) = bias {
        for row in y.chunks_mut(w.out_dim) {
            for (v, bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
}

/// `y[dst[r], :] += scale · W · x[r, :]` for each input row `r` of `x` (`[dst.len(), in]`); `y` is
/// `[_, out]`. The LoRA up-projection: its products land straight in the base output, without a
/// temporary and a second pass over it. `dst` must not repeat a row.
pub fn linear_add_rows(x: &[f32], w: Matrix, scale: f32, y: &mut [f32], dst: &[usize]) {
    let rows = dst.len();
    assert_eq!(x.len(), rows * w.in_dim, "linear_add_rows: input size");
    assert!(
        dst.iter().all(|&r| (r + 1) * w.out_dim <= y.len()),
        "linear_add_rows: output row out of range"
    );
    if rows == 0 {
        return;
    }
    if rows <= GEMV_MAX_ROWS {
        let mut seen = [usize::MAX; GEMV_MAX_ROWS];
        for (i, &r) in dst.iter().enumerate() {
            assert!(!seen[..i].contains(&r), "linear_add_rows: row {r} repeated");
            seen[i] = r;
        }
        gemv(x, rows, w, y, Store::AddScaled { dst, scale });
    } else {
        let t = linear_new(x, rows, w, None);
        for (tr, &r) in t.chunks(w.out_dim).zip(dst) {
            for (o, v) in y[r * w.out_dim..(r + 1) * w.out_dim].iter_mut().zip(tr) {
                *o += scale * v;
            }
        }
    }
}

/// Convenience: allocate the output.
pub fn linear_new(x: &[f32], rows: usize, w: Matrix, bias: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![0.0; rows * w.out_dim];
    linear(x, rows, w, bias, &mut y);
    y
}

// ---------------------------------------------------------------------------------------------
// GEMV path

/// At most this many output rows per rayon task: enough work to amortise scheduling, small
/// enough to balance the two to sixteen cores this runs on.
const GEMV_CHUNK: usize = 64;

/// How the GEMV writes output element (r, o).
#[derive(Clone, Copy)]
enum Store<'a> {
    /// `y[r, o] = v`
    Set,
    /// `y[dst[r], o] += scale · v`
    AddScaled { dst: &'a [usize], scale: f32 },
}

fn gemv(x: &[f32], rows: usize, w: Matrix, y: &mut [f32], store: Store) {
    let out_dim = w.out_dim;
    let in_dim = w.in_dim;
    let yp = SendPtr(y.as_mut_ptr());
    // Small matrices (a LoRA down-projection has r ≤ a few hundred rows) still spread over every
    // thread: about four tasks per thread.
    let chunk = out_dim
        .div_ceil(4 * rayon::current_num_threads())
        .clamp(1, GEMV_CHUNK);
    let chunks = out_dim.div_ceil(chunk);
    let path = super::path::active().vector();
    (0..chunks).into_par_iter().for_each(|c| {
        let o0 = c * chunk;
        let o1 = (o0 + chunk).min(out_dim);
        let put = |o: usize, acc: &[f32]| {
            for (r, &v) in acc[..rows].iter().enumerate() {
                // SAFETY: the callers checked that every written index is inside `y`; (row, o)
                // pairs are disjoint across tasks (each task owns columns o0..o1, and `dst` rows
                // are distinct), so no two tasks touch the same element.
                unsafe {
                    match store {
                        Store::Set => *yp.ptr().add(r * out_dim + o) = v,
                        Store::AddScaled { dst, scale } => {
                            *yp.ptr().add(dst[r] * out_dim + o) += scale * v
                        }
                    }
                }
            }
        };
        let (mut acc0, mut acc1) = ([0f32; GEMV_MAX_ROWS], [0f32; GEMV_MAX_ROWS]);
        let mut o = o0;
        while o < o1 {
            if o + 1 < o1 && dot2_rows(path, w.data, o, in_dim, x, rows, &mut acc0, &mut acc1) {
                put(o, &acc0);
                put(o + 1, &acc1);
                o += 2;
            } else {
                dot_rows(path, w.data, o * in_dim, in_dim, x, rows, &mut acc0);
                put(o, &acc0);
                o += 1;
            }
        }
    });
}

/// Weight rows `o` and `o + 1` against every input row at once, where that pays (AVX-512, bf16,
/// more than one input row: each input load then feeds two FMAs). False: not done, use
/// [`dot_rows`].
#[inline]
#[allow(clippy::too_many_arguments)]
fn dot2_rows(
    path: KernelPath,
    w: WeightData,
    o: usize,
    n: usize,
    x: &[f32],
    rows: usize,
    acc0: &mut [f32],
    acc1: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let (KernelPath::Avx512, WeightData::Bf16(s), true) = (path, w, rows > 1) {
        let (w0, w1) = (&s[o * n..(o + 1) * n], &s[(o + 1) * n..(o + 2) * n]);
        assert!(x.len() >= rows * n && acc0.len() >= rows && acc1.len() >= rows);
        assert!(path.supported(), "kernel path {path} not supported");
        // SAFETY: AVX-512 supported (asserted), lengths asserted above.
        unsafe { super::avx512::dot2_rows_bf16_avx512(w0, w1, x, rows, acc0, acc1) };
        return true;
    }
    let _ = (path, w, o, n, x, rows, acc0, acc1);
    false
}

/// `acc[r] = Σ_k W[off + k] · x[r·n + k]` for every input row r.
#[inline]
fn dot_rows(
    path: KernelPath,
    w: WeightData,
    off: usize,
    n: usize,
    x: &[f32],
    rows: usize,
    acc: &mut [f32],
) {
    match w {
        WeightData::Bf16(s) => dot_rows_bf16(path, &s[off..off + n], x, rows, acc),
        WeightData::F16(s) => dot_rows_scalar(
            |k| crate::checkpoint::store::f16_to_f32(s[off + k]),
            n,
            x,
            &mut acc[..rows],
        ),
        WeightData::F32(s) => dot_rows_scalar(|k| s[off + k], n, x, &mut acc[..rows]),
    }
}

/// One bf16 weight row `w` dotted with `rows` rows of `x` on `path`.
#[inline]
fn dot_rows_bf16(path: KernelPath, w: &[u16], x: &[f32], rows: usize, acc: &mut [f32]) {
    assert!(x.len() >= rows * w.len() && acc.len() >= rows);
    // `path::active` only yields supported paths; the check keeps this function safe for any
    // caller (a cached flag, negligible next to a weight row's dot).
    assert!(path.supported(), "kernel path {path} not supported");
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            // SAFETY: the CPU supports the path and the lengths hold (both asserted above).
            unsafe { super::avx512::dot_rows_bf16_avx512(w, x, rows, acc) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => {
            // SAFETY: as above, for AVX2 + FMA.
            unsafe { super::avx2::dot_rows_bf16_avx2(w, x, rows, acc) }
        }
        _ => dot_rows_scalar(
            |k| crate::checkpoint::store::bf16_to_f32(w[k]),
            w.len(),
            x,
            &mut acc[..rows],
        ),
    }
}

#[inline]
fn dot_rows_scalar(w: impl Fn(usize) -> f32, n: usize, x: &[f32], acc: &mut [f32]) {
    // Widen a block of the weight row once, then dot it against every input row.
    const BLOCK: usize = 256;
    let mut buf = [0f32; BLOCK];
    acc.fill(0.0);
    let mut k0 = 0;
    while k0 < n {
        let len = BLOCK.min(n - k0);
        for (i, b) in buf[..len].iter_mut().enumerate() {
            *b = w(k0 + i);
        }
        for (r, a) in acc.iter_mut().enumerate() {
            let xr = &x[r * n + k0..r * n + k0 + len];
            let mut s = [0f32; 8];
            for (i, (wv, xv)) in buf[..len].iter().zip(xr).enumerate() {
                s[i % 8] += wv * xv;
            }
            *a += s.iter().sum::<f32>();
        }
        k0 += len;
    }
}

// ---------------------------------------------------------------------------------------------
// Tiled GEMM path

/// Weight rows per tile. On the widening paths each tile is one `sgemm` call, and every call
/// packs its block of input rows again, so small tiles repack the input often (the four linears
/// of a benchmark-config layer on 128 rows: 186 GFLOP/s with tiles of 64 rows, 248 with 256, on
/// a 2-core Zen machine). A tile of at most 1 MiB of f32 (half that in bf16, as the AVX-512 path
/// reads it) still sits in a core's L2 while the GEMM sweeps it, and there are at least two tiles
/// per thread, so the pool stays balanced on many cores.
fn tile_rows(in_dim: usize, out_dim: usize, row_blocks: usize) -> usize {
    const TILE_F32: usize = 1 << 18;
    let by_cache = TILE_F32 / in_dim.max(1);
    let tiles_wanted = (2 * rayon::current_num_threads()).div_ceil(row_blocks.max(1));
    let by_balance = out_dim / tiles_wanted.max(1);
    // Multiples of 16 rows: whole register blocks of the sgemm kernel.
    (by_cache.min(by_balance) / 16 * 16).clamp(16, 256)
}

/// Input rows per task, so that long prefills also spread over threads when `out` is small.
const GEMM_ROW_BLOCK: usize = 512;

fn gemm_tiled(x: &[f32], rows: usize, w: Matrix, y: &mut [f32]) {
    gemm_tiled_on(super::path::active(), x, rows, w, y)
}

/// The tiled GEMM on `path`: with bf16 weights, on AMX tiles (`amx::gemm_bf16_amx`, the
/// activations split and packed once for all tiles) or in AVX-512 register blocks that read the
/// weights in bf16 (`avx512::gemm_bf16_avx512`); otherwise each tile widened to f32 and
/// multiplied by `matrixmultiply::sgemm`.
fn gemm_tiled_on(path: KernelPath, x: &[f32], rows: usize, w: Matrix, y: &mut [f32]) {
    let (out_dim, in_dim) = (w.out_dim, w.in_dim);
    let row_blocks = rows.div_ceil(GEMM_ROW_BLOCK);
    let mut nb = tile_rows(in_dim, out_dim, row_blocks);
    if path == KernelPath::Amx {
        // The AMX kernel takes weight rows 32 at a time (two tiles of 16).
        nb = nb.next_multiple_of(32);
    }
    let col_tiles = out_dim.div_ceil(nb);
    let yp = SendPtr(y.as_mut_ptr());
    assert!(path.supported(), "kernel path {path} not supported");
    #[cfg(target_arch = "x86_64")]
    let packed = match (path, w.data) {
        (KernelPath::Amx, WeightData::Bf16(_)) => {
            // SAFETY: the AMX path implies AVX-512 (`KernelPath::supported`), asserted above.
            Some(unsafe { super::amx::pack(x, rows, in_dim) })
        }
        _ => None,
    };
    (0..col_tiles * row_blocks)
        .into_par_iter()
        .for_each_init(Vec::new, |tile, t| {
            let (ct, rb) = (t % col_tiles, t / col_tiles);
            let o0 = ct * nb;
            let n = nb.min(out_dim - o0);
            let r0 = rb * GEMM_ROW_BLOCK;
            let m = GEMM_ROW_BLOCK.min(rows - r0);
            let xs = &x[r0 * in_dim..(r0 + m) * in_dim];
            #[cfg(target_arch = "x86_64")]
            if let WeightData::Bf16(s) = w.data {
                let ws = &s[o0 * in_dim..(o0 + n) * in_dim];
                let out = yp.ptr().wrapping_add(o0);
                if let Some(packed) = &packed {
                    // SAFETY: AMX and AVX-512 supported (asserted above); `packed` holds every
                    // row, r0 is a multiple of GEMM_ROW_BLOCK (of 32); this task alone writes
                    // the block y[r0..r0+m, o0..o0+n].
                    unsafe {
                        super::amx::gemm_bf16_amx(packed, r0, m, ws, n, in_dim, out, out_dim)
                    };
                    return;
                }
                if path == KernelPath::Avx512 {
                    // SAFETY: AVX-512 supported (asserted above); `xs` holds m rows and `ws` n
                    // rows of in_dim; this task alone writes the block y[r0..r0+m, o0..o0+n].
                    unsafe {
                        super::avx512::gemm_bf16_avx512(
                            xs,
                            m,
                            in_dim,
                            ws,
                            n,
                            out.add(r0 * out_dim),
                            out_dim,
                        )
                    };
                    return;
                }
            }
            tile.resize(n * in_dim, 0.0);
            w.data.widen_into(o0 * in_dim, &mut tile[..n * in_dim]);
            // SAFETY: sgemm reads x/tile within bounds given by m, k, n and strides, and writes the
            // disjoint block y[r0..r0+m, o0..o0+n].
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    in_dim,
                    n,
                    1.0,
                    xs.as_ptr(),
                    in_dim as isize,
                    1,
                    tile.as_ptr(),
                    1,
                    in_dim as isize,
                    0.0,
                    yp.ptr().add(r0 * out_dim + o0),
                    out_dim as isize,
                    1,
                );
            }
        });
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::kernels::path;

    /// Uniform in [-1, 1): the kernels' tests' input generator.
    pub(in crate::kernels) fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Each SIMD path's bf16 dot against the scalar path, for lengths that hit every tail of the
    /// 8-, 16- and 32-wide loops and every row count of the GEMV. A path this CPU lacks is
    /// reported on stderr outside the test harness's capture, so the skip is visible.
    #[test]
    fn every_simd_path_matches_scalar() {
        let mut seed = 99u64;
        for path in [KernelPath::Avx512, KernelPath::Avx2] {
            if !path::supported_or_report(path, "unit test") {
                continue;
            }
            for n in [
                1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1024, 3072, 3075,
            ] {
                let w: Vec<u16> = (0..n)
                    .map(|_| (lcg(&mut seed).to_bits() >> 16) as u16)
                    .collect();
                for rows in 1..=GEMV_MAX_ROWS {
                    let x: Vec<f32> = (0..rows * n).map(|_| lcg(&mut seed)).collect();
                    let mut want = [0f32; GEMV_MAX_ROWS];
                    let mut got = [f32::NAN; GEMV_MAX_ROWS];
                    dot_rows_bf16(KernelPath::Scalar, &w, &x, rows, &mut want);
                    dot_rows_bf16(path, &w, &x, rows, &mut got);
                    for (r, (g, e)) in got[..rows].iter().zip(&want).enumerate() {
                        // Summation order differs: f32 rounding of a length-n sum of |terms| ≤ 1.
                        let tol = 1e-6 * n as f32;
                        assert!(
                            (g - e).abs() <= tol,
                            "{path} n={n} rows={rows} row {r}: {g} vs scalar {e}"
                        );
                    }
                }
            }
        }
    }

    /// The two-weight-row AVX-512 loop against the scalar path, through the GEMV (odd and even
    /// output counts, every row count).
    #[test]
    fn paired_rows_match_scalar() {
        if !path::supported_or_report(KernelPath::Avx512, "paired-row test") {
            return;
        }
        let mut seed = 5u64;
        for n in [7, 16, 33, 1024] {
            let w: Vec<u16> = (0..5 * n)
                .map(|_| (lcg(&mut seed).to_bits() >> 16) as u16)
                .collect();
            for rows in 2..=GEMV_MAX_ROWS {
                let x: Vec<f32> = (0..rows * n).map(|_| lcg(&mut seed)).collect();
                let (mut a0, mut a1) = ([0f32; GEMV_MAX_ROWS], [0f32; GEMV_MAX_ROWS]);
                for o in 0..4 {
                    assert!(dot2_rows(
                        KernelPath::Avx512,
                        WeightData::Bf16(&w),
                        o,
                        n,
                        &x,
                        rows,
                        &mut a0,
                        &mut a1
                    ));
                    for (k, got) in [(o, &a0), (o + 1, &a1)] {
                        let mut want = [0f32; GEMV_MAX_ROWS];
                        dot_rows_bf16(
                            KernelPath::Scalar,
                            &w[k * n..(k + 1) * n],
                            &x,
                            rows,
                            &mut want,
                        );
                        for (r, (g, e)) in got[..rows].iter().zip(&want).enumerate() {
                            assert!(
                                (g - e).abs() <= 1e-6 * n as f32,
                                "n={n} rows={rows} out {k} row {r}: {g} vs {e}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The fused LoRA up-projection equals a plain product added afterwards, on the GEMV and the
    /// tiled path, with rows scattered out of order.
    #[test]
    fn linear_add_rows_matches_product_then_add() {
        let mut seed = 7u64;
        let (out_dim, in_dim) = (37, 24);
        let w: Vec<u16> = (0..out_dim * in_dim)
            .map(|_| (lcg(&mut seed).to_bits() >> 16) as u16)
            .collect();
        let m = Matrix {
            data: WeightData::Bf16(&w),
            out_dim,
            in_dim,
        };
        for dst in [
            vec![3usize],
            vec![5, 0, 2],
            (0..12).rev().collect::<Vec<_>>(),
        ] {
            let x: Vec<f32> = (0..dst.len() * in_dim).map(|_| lcg(&mut seed)).collect();
            let y0: Vec<f32> = (0..12 * out_dim).map(|_| lcg(&mut seed)).collect();
            let mut y = y0.clone();
            linear_add_rows(&x, m, 0.5, &mut y, &dst);
            let p = linear_new(&x, dst.len(), m, None);
            let mut want = y0.clone();
            for (j, &r) in dst.iter().enumerate() {
                for o in 0..out_dim {
                    want[r * out_dim + o] += 0.5 * p[j * out_dim + o];
                }
            }
            for (i, (g, e)) in y.iter().zip(&want).enumerate() {
                assert!((g - e).abs() < 1e-5, "dst {dst:?} element {i}: {g} vs {e}");
            }
        }
    }

    /// bf16 weights with awkward sizes (tails of the 32- and 8-wide loops), every row count from
    /// the GEMV path to the tiled GEMM path, against a plain f64 reference.
    #[test]
    fn gemv_and_gemm_paths_agree_with_reference() {
        let mut seed = 12345u64;
        let mut next = || lcg(&mut seed);
        for (out_dim, in_dim) in [(7, 45), (70, 588), (3, 8), (130, 33)] {
            let w: Vec<u16> = (0..out_dim * in_dim)
                .map(|_| (next().to_bits() >> 16) as u16)
                .collect();
            let m = Matrix {
                data: WeightData::Bf16(&w),
                out_dim,
                in_dim,
            };
            for rows in [1, 2, 3, 5, 8, 9, 20] {
                let x: Vec<f32> = (0..rows * in_dim).map(|_| next()).collect();
                let bias: Vec<f32> = (0..out_dim).map(|_| next()).collect();
                let y = linear_new(&x, rows, m, Some(&bias));
                for r in 0..rows {
                    for o in 0..out_dim {
                        let want: f64 = bias[o] as f64
                            + (0..in_dim)
                                .map(|k| {
                                    let wv = f32::from_bits((w[o * in_dim + k] as u32) << 16);
                                    wv as f64 * x[r * in_dim + k] as f64
                                })
                                .sum::<f64>();
                        let got = y[r * out_dim + o] as f64;
                        assert!(
                            (got - want).abs() < 1e-4,
                            "{out_dim}x{in_dim} rows {rows}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Every path's GEMM is as accurate as an f32 sum: against an f64 reference, its largest
    /// error over inputs spanning many magnitudes stays within a few times what f32 rounding of
    /// the products and sums alone gives. (On the AMX path this needs all three bf16 parts of
    /// each activation: with two, the worst error here is 2.6e-6, against 1.0e-7 with three and
    /// 0.4–1.3e-7 on the other paths.)
    #[test]
    fn gemm_paths_are_as_accurate_as_f32() {
        let mut seed = 4242u64;
        let (out_dim, in_dim, rows) = (64, 1024, 64);
        let w: Vec<u16> = (0..out_dim * in_dim)
            .map(|_| (lcg(&mut seed).to_bits() >> 16) as u16)
            .collect();
        let x: Vec<f32> = (0..rows * in_dim)
            .map(|i| lcg(&mut seed) * [1.0, 37.5, 0.0123][i % 3])
            .collect();
        let m = Matrix {
            data: WeightData::Bf16(&w),
            out_dim,
            in_dim,
        };
        let reference = |r: usize, o: usize| -> (f64, f64) {
            (0..in_dim)
                .map(|k| {
                    let p = f32::from_bits((w[o * in_dim + k] as u32) << 16) as f64
                        * x[r * in_dim + k] as f64;
                    (p, p.abs())
                })
                .fold((0.0, 0.0), |(s, a), (p, q)| (s + p, a + q))
        };
        for path in KernelPath::ALL {
            if !path::supported_or_report(path, "GEMM accuracy test") {
                continue;
            }
            let mut y = vec![f32::NAN; rows * out_dim];
            gemm_tiled_on(path, &x, rows, m, &mut y);
            let mut worst = 0f64;
            for r in 0..rows {
                for o in 0..out_dim {
                    let (want, magnitude) = reference(r, o);
                    // Relative to the sum of |terms|, which bounds what f32 rounding can do.
                    let err = (y[r * out_dim + o] as f64 - want).abs() / magnitude;
                    worst = worst.max(err);
                }
            }
            assert!(
                worst < 5e-7,
                "{path}: worst error {worst:e} of the sum of |terms|"
            );
        }
    }

    /// The tiled GEMM on every kernel path this CPU has against an f64 reference, for shapes that
    /// hit every edge: register-block tails in both directions, a k tail, k longer than one pass
    /// of the AVX-512 blocks, several row blocks, and tiles of every size.
    #[test]
    fn gemm_paths_match_an_f64_reference() {
        let mut seed = 777u64;
        let mut next = || lcg(&mut seed);
        for (out_dim, in_dim, rows) in [
            (70, 45, 9),
            (13, 2100, 13),
            (37, 1024, 600),
            (260, 64, 31),
            (64, 1024, 128),
            (48, 96, 40),
        ] {
            let w: Vec<u16> = (0..out_dim * in_dim)
                .map(|_| (next().to_bits() >> 16) as u16)
                .collect();
            let x: Vec<f32> = (0..rows * in_dim).map(|_| next()).collect();
            let m = Matrix {
                data: WeightData::Bf16(&w),
                out_dim,
                in_dim,
            };
            for path in KernelPath::ALL {
                if !path::supported_or_report(path, "GEMM test") {
                    continue;
                }
                let mut y = vec![f32::NAN; rows * out_dim];
                gemm_tiled_on(path, &x, rows, m, &mut y);
                for r in 0..rows {
                    for o in 0..out_dim {
                        let want: f64 = (0..in_dim)
                            .map(|k| {
                                let wv = f32::from_bits((w[o * in_dim + k] as u32) << 16);
                                wv as f64 * x[r * in_dim + k] as f64
                            })
                            .sum();
                        let got = y[r * out_dim + o] as f64;
                        assert!(
                            (got - want).abs() < 1e-6 * in_dim as f64,
                            "{path} {out_dim}x{in_dim} rows {rows} ({r}, {o}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
