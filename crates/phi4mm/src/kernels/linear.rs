//! Linear layers over weights kept in their on-disk precision.
//!
//! Two paths, both widening bf16/f16 to f32 inside the kernel so the numbers equal f32 compute:
//! - few rows (decode): a multithreaded GEMV that streams each weight row once from memory and
//!   dots it against every input row (AVX2+FMA when the CPU has it). Decode is memory-bound, so
//!   reading half the bytes of f32 is the whole game.
//! - many rows (prefill, encoders): weight tiles widened to f32 and multiplied with
//!   `matrixmultiply::sgemm`, tiles spread over the rayon pool.

use rayon::prelude::*;

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
        gemv(x, rows, w, y);
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

/// Convenience: allocate the output.
pub fn linear_new(x: &[f32], rows: usize, w: Matrix, bias: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![0.0; rows * w.out_dim];
    linear(x, rows, w, bias, &mut y);
    y
}

// ---------------------------------------------------------------------------------------------
// GEMV path

/// Output rows handled per rayon task: enough work to amortise scheduling, small enough to
/// balance the two to sixteen cores this runs on.
const GEMV_CHUNK: usize = 64;

fn gemv(x: &[f32], rows: usize, w: Matrix, y: &mut [f32]) {
    let out_dim = w.out_dim;
    let in_dim = w.in_dim;
    let yp = SendPtr(y.as_mut_ptr());
    let chunks = out_dim.div_ceil(GEMV_CHUNK);
    (0..chunks).into_par_iter().for_each(|c| {
        let o0 = c * GEMV_CHUNK;
        let o1 = (o0 + GEMV_CHUNK).min(out_dim);
        let mut acc = [0f32; GEMV_MAX_ROWS];
        for o in o0..o1 {
            dot_rows(w.data, o * in_dim, in_dim, x, rows, &mut acc[..rows]);
            for (r, &v) in acc[..rows].iter().enumerate() {
                // SAFETY: (r, o) pairs are disjoint across tasks (each task owns columns o0..o1).
                unsafe { *yp.ptr().add(r * out_dim + o) = v };
            }
        }
    });
}

/// `acc[r] = Σ_k W[off + k] · x[r·n + k]` for every input row r.
#[inline]
fn dot_rows(w: WeightData, off: usize, n: usize, x: &[f32], rows: usize, acc: &mut [f32]) {
    match w {
        WeightData::Bf16(s) => {
            #[cfg(target_arch = "x86_64")]
            {
                if super::avx2::has_avx2_fma() {
                    // SAFETY: the CPU supports AVX2 and FMA (checked above).
                    unsafe { super::avx2::dot_rows_bf16_avx2(&s[off..off + n], x, rows, acc) };
                    return;
                }
            }
            dot_rows_scalar(
                |k| crate::checkpoint::store::bf16_to_f32(s[off + k]),
                n,
                x,
                acc,
            );
        }
        WeightData::F16(s) => dot_rows_scalar(
            |k| crate::checkpoint::store::f16_to_f32(s[off + k]),
            n,
            x,
            acc,
        ),
        WeightData::F32(s) => dot_rows_scalar(|k| s[off + k], n, x, acc),
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

/// Weight rows widened per tile: keeps a tile (≤ 256 KiB of f32) in L2 while the GEMM sweeps it.
fn tile_rows(in_dim: usize) -> usize {
    (65536 / in_dim.max(1)).clamp(16, 256)
}

/// Input rows per task, so that long prefills also spread over threads when `out` is small.
const GEMM_ROW_BLOCK: usize = 512;

fn gemm_tiled(x: &[f32], rows: usize, w: Matrix, y: &mut [f32]) {
    let (out_dim, in_dim) = (w.out_dim, w.in_dim);
    let nb = tile_rows(in_dim);
    let col_tiles = out_dim.div_ceil(nb);
    let row_blocks = rows.div_ceil(GEMM_ROW_BLOCK);
    let yp = SendPtr(y.as_mut_ptr());
    (0..col_tiles * row_blocks)
        .into_par_iter()
        .for_each_init(Vec::new, |tile, t| {
            let (ct, rb) = (t % col_tiles, t / col_tiles);
            let o0 = ct * nb;
            let n = nb.min(out_dim - o0);
            let r0 = rb * GEMM_ROW_BLOCK;
            let m = GEMM_ROW_BLOCK.min(rows - r0);
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
                    x.as_ptr().add(r0 * in_dim),
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
mod tests {
    use super::*;

    /// bf16 weights with awkward sizes (tails of the 32- and 8-wide loops), every row count from
    /// the GEMV path to the tiled GEMM path, against a plain f64 reference.
    #[test]
    fn gemv_and_gemm_paths_agree_with_reference() {
        let mut seed = 12345u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
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
}
