//! The GEMV's bf16 inner loop with AVX-512: sixteen bf16 weights widened to f32 per load (a
//! zero-extend and a shift; exact, bf16 is the top half of an f32) and fused-multiply-added
//! against each input row in f32. Tails use masked loads, so no scalar remainder loop.
//!
//! Every input row has its own accumulators, and the row count is a const parameter so that they
//! all stay in registers: one widened weight vector feeds up to eight rows (the decode batch).
//! With several input rows, two weight rows are dotted at once ([`dot2_rows_bf16_avx512`]), so
//! each input vector loaded feeds two FMAs: at batch 8 the loads of the inputs, not the weights,
//! would otherwise bound the loop.

use std::arch::x86_64::*;

/// 16 bf16 at `p` (only the lanes in `m` are read) → 16 f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn widen16(p: *const u16, m: __mmask16) -> __m512 {
    // SAFETY: the caller passes a pointer whose lanes selected by `m` are readable; masked-off
    // lanes are not accessed (AVX-512 masked loads suppress their faults). AVX-512F/BW/VL are this
    // function's target features, which the caller has checked.
    unsafe {
        let h = _mm256_maskz_loadu_epi16(m, p.cast());
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
    }
}

/// How far ahead of the loads the GEMV asks for weights (`prefetcht0`), in bf16 values: 2 KiB.
/// A decode step streams the weights from memory once; the hardware prefetcher stops at every
/// 4 KiB page and restarts behind the loads, and with the request issued this far ahead the
/// stream stays ahead of them. Measured on a 2-vCPU Xeon (`phi4mm bench`, batch 1): the LM head
/// from 21.2 to 18.3 ms, 0.71 → 0.83 of the bandwidth bound; 512 values gained less, 2048 and
/// 4096 the same within noise.
const PREFETCH_AHEAD: usize = 1024;

/// Asks for the cache line `ahead` values after `p` (a hint: it never faults, even past the end
/// of the weights).
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch_ahead(p: *const u16) {
    // A prefetch reads nothing architecturally and cannot fault (so it is a safe intrinsic);
    // `wrapping_add` keeps the address computation defined wherever it points.
    // Safe to call in newer Rust; the block keeps the workspace's rust-version building.
    #[allow(unused_unsafe)]
    // SAFETY: as above, a prefetch hint has no effect a program can observe.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast())
    }
}

/// `acc[r] = Σ_k w[k] · x[r·n + k]` for `R` rows, `n = w.len()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dot_rows_n<const R: usize>(w: &[u16], x: &[f32], acc: &mut [f32]) {
    // SAFETY: the caller guarantees AVX-512F/BW/VL and `x.len() >= R * w.len()`; every load reads
    // `w[k..k + 16]` / `x[r * n + k..r * n + k + 16]` with k + 16 <= n, or the masked lanes of the
    // final partial block, which stay below n.
    unsafe {
        let n = w.len();
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut a = [_mm512_setzero_ps(); R];
        let mut k = 0;
        if R == 1 {
            // One row: a second accumulator chain hides the FMA latency.
            let mut a1 = _mm512_setzero_ps();
            while k + 32 <= n {
                prefetch_ahead(wp.add(k));
                let w0 = widen16(wp.add(k), !0);
                let w1 = widen16(wp.add(k + 16), !0);
                a[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp.add(k)), a[0]);
                a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp.add(k + 16)), a1);
                k += 32;
            }
            a[0] = _mm512_add_ps(a[0], a1);
        }
        while k + 16 <= n {
            prefetch_ahead(wp.add(k));
            let wv = widen16(wp.add(k), !0);
            for (r, ar) in a.iter_mut().enumerate() {
                *ar = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp.add(r * n + k)), *ar);
            }
            k += 16;
        }
        if k < n {
            let m: __mmask16 = (1u32 << (n - k)) as u16 - 1;
            let wv = widen16(wp.add(k), m);
            for (r, ar) in a.iter_mut().enumerate() {
                *ar = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xp.add(r * n + k)), *ar);
            }
        }
        for (r, ar) in a.iter().enumerate() {
            acc[r] = _mm512_reduce_add_ps(*ar);
        }
    }
}

/// Dot of one bf16 weight row `w` against `rows` f32 rows of `x` (row stride `w.len()`).
///
/// # Safety
/// The CPU must support AVX-512F, BW and VL; `x` must hold `rows * w.len()` values and `acc`
/// at least `rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn dot_rows_bf16_avx512(w: &[u16], x: &[f32], rows: usize, acc: &mut [f32]) {
    let n = w.len();
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(8);
        let (xs, a) = (&x[r0 * n..], &mut acc[r0..]);
        // SAFETY: forwarded from this function's contract; `xs` holds `nr` rows of `n`.
        unsafe {
            match nr {
                1 => dot_rows_n::<1>(w, xs, a),
                2 => dot_rows_n::<2>(w, xs, a),
                3 => dot_rows_n::<3>(w, xs, a),
                4 => dot_rows_n::<4>(w, xs, a),
                5 => dot_rows_n::<5>(w, xs, a),
                6 => dot_rows_n::<6>(w, xs, a),
                7 => dot_rows_n::<7>(w, xs, a),
                _ => dot_rows_n::<8>(w, xs, a),
            }
        }
        r0 += nr;
    }
}

/// `acc0[r] = w0 · x_r`, `acc1[r] = w1 · x_r` for `R` rows (`w0.len() == w1.len() == n`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dot2_rows_n<const R: usize>(
    w0: &[u16],
    w1: &[u16],
    x: &[f32],
    acc0: &mut [f32],
    acc1: &mut [f32],
) {
    // SAFETY: as `dot_rows_n`, for two weight rows of the same length `n`.
    unsafe {
        let n = w0.len();
        let (p0, p1, xp) = (w0.as_ptr(), w1.as_ptr(), x.as_ptr());
        let mut a = [_mm512_setzero_ps(); R];
        let mut b = [_mm512_setzero_ps(); R];
        let mut k = 0;
        while k + 16 <= n {
            prefetch_ahead(p0.add(k));
            prefetch_ahead(p1.add(k));
            let (v0, v1) = (widen16(p0.add(k), !0), widen16(p1.add(k), !0));
            for (r, (ar, br)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
                let xv = _mm512_loadu_ps(xp.add(r * n + k));
                *ar = _mm512_fmadd_ps(v0, xv, *ar);
                *br = _mm512_fmadd_ps(v1, xv, *br);
            }
            k += 16;
        }
        if k < n {
            let m: __mmask16 = (1u32 << (n - k)) as u16 - 1;
            let (v0, v1) = (widen16(p0.add(k), m), widen16(p1.add(k), m));
            for (r, (ar, br)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
                let xv = _mm512_maskz_loadu_ps(m, xp.add(r * n + k));
                *ar = _mm512_fmadd_ps(v0, xv, *ar);
                *br = _mm512_fmadd_ps(v1, xv, *br);
            }
        }
        for (((o0, o1), ar), br) in acc0.iter_mut().zip(acc1.iter_mut()).zip(&a).zip(&b) {
            *o0 = _mm512_reduce_add_ps(*ar);
            *o1 = _mm512_reduce_add_ps(*br);
        }
    }
}

/// Two bf16 weight rows of equal length against `rows` f32 rows of `x`.
///
/// # Safety
/// As [`dot_rows_bf16_avx512`]; `w1.len() == w0.len()` and both `acc0`, `acc1` hold `rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn dot2_rows_bf16_avx512(
    w0: &[u16],
    w1: &[u16],
    x: &[f32],
    rows: usize,
    acc0: &mut [f32],
    acc1: &mut [f32],
) {
    let n = w0.len();
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(8);
        let (xs, a, b) = (&x[r0 * n..], &mut acc0[r0..], &mut acc1[r0..]);
        // SAFETY: forwarded from this function's contract; `xs` holds `nr` rows of `n`.
        unsafe {
            match nr {
                1 => dot2_rows_n::<1>(w0, w1, xs, a, b),
                2 => dot2_rows_n::<2>(w0, w1, xs, a, b),
                3 => dot2_rows_n::<3>(w0, w1, xs, a, b),
                4 => dot2_rows_n::<4>(w0, w1, xs, a, b),
                5 => dot2_rows_n::<5>(w0, w1, xs, a, b),
                6 => dot2_rows_n::<6>(w0, w1, xs, a, b),
                7 => dot2_rows_n::<7>(w0, w1, xs, a, b),
                _ => dot2_rows_n::<8>(w0, w1, xs, a, b),
            }
        }
        r0 += nr;
    }
}

// ---------------------------------------------------------------------------------------------
// GEMM (prefill, encoders): register blocks of dot products, weights read in bf16 straight from
// the checkpoint — no widened copy, no transposed packing.

/// Input rows per register block.
const MR: usize = 6;
/// Weight rows per register block: 6 × 4 accumulators take 24 of the 32 zmm registers, and each
/// step of 16 along k loads 6 input and 4 widened weight vectors for 24 FMAs.
const NR: usize = 4;
/// Length of k taken per pass: `MR` input rows of it (24 KiB of f32) stay in L1 while every weight
/// row of the tile streams past them.
const KC: usize = 1024;

/// One register block of one pass along k: `R` input rows at `x` and `C` weight rows at `w`,
/// both of stride `ld`, over `kc` values of k, into `R` rows of `C` outputs at `y` (stride
/// `ldy`), added to what is there when `add`, else stored.
#[derive(Clone, Copy)]
struct Block {
    x: *const f32,
    w: *const u16,
    ld: usize,
    kc: usize,
    y: *mut f32,
    ldy: usize,
    add: bool,
}

/// `y[i·ldy + j] (+)= Σ_{k < kc} x[i·ld + k] · w[j·ld + k]` for the `R` × `C` block `b`.
///
/// # Safety
/// AVX-512F/BW/VL; `b.x` readable for `R` rows of `b.kc` at stride `b.ld`, `b.w` for `C` rows,
/// `b.y` writable for `R` rows of `C` at stride `b.ldy`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn gemm_block<const R: usize, const C: usize>(b: Block) {
    let Block {
        x,
        w,
        ld,
        kc,
        y,
        ldy,
        add,
    } = b;
    // SAFETY: the caller's contract covers every address: loads at k + 16 <= kc, or the masked
    // lanes of the last partial step, which stay below kc.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut k = 0;
        while k + 16 <= kc {
            gemm_step(&mut acc, x.add(k), w.add(k), ld, !0);
            k += 16;
        }
        if k < kc {
            let m = ((1u32 << (kc - k)) - 1) as u16;
            gemm_step(&mut acc, x.add(k), w.add(k), ld, m);
        }
        for (i, row) in acc.iter().enumerate() {
            let out = y.add(i * ldy);
            if C == 4 {
                let sums = hsum4(row[0], row[1], row[2], row[3]);
                let prev = if add {
                    _mm_loadu_ps(out)
                } else {
                    _mm_setzero_ps()
                };
                _mm_storeu_ps(out, _mm_add_ps(prev, sums));
            } else {
                for (j, a) in row.iter().enumerate() {
                    let v = _mm512_reduce_add_ps(*a);
                    *out.add(j) = if add { *out.add(j) + v } else { v };
                }
            }
        }
    }
}

/// The sums of the sixteen lanes of each of `a0..a3`, in that order: halves, then quarters of
/// the four added pairwise in one register, then the four lanes of each quarter (15 shuffles and
/// adds for the four, where one full reduction each takes 32).
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum4(a0: __m512, a1: __m512, a2: __m512, a3: __m512) -> __m128 {
    // [a.q0 + a.q2, a.q1 + a.q3, b.q0 + b.q2, b.q1 + b.q3] (q: a 128-bit quarter).
    let halves = |a, b| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    let (t01, t23) = (halves(a0, a1), halves(a2, a3));
    // Quarter k now holds four partial sums of a_k.
    let q = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(t01, t23),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(t01, t23),
    );
    let q = _mm512_add_ps(q, _mm512_permute_ps::<0b10_11_00_01>(q));
    let q = _mm512_add_ps(q, _mm512_permute_ps::<0b01_00_11_10>(q));
    _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, q))
}

/// One step of 16 along k (the lanes in `m`) of a register block: `C` weight vectors widened
/// once, each of the `R` input vectors multiplied into its `C` accumulators.
///
/// # Safety
/// AVX-512F/BW/VL; the lanes in `m` of `R` rows at `x` and `C` rows at `w` (both of stride `ld`)
/// are readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn gemm_step<const R: usize, const C: usize>(
    acc: &mut [[__m512; C]; R],
    x: *const f32,
    w: *const u16,
    ld: usize,
    m: __mmask16,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let mut wv = [_mm512_setzero_ps(); C];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = widen16(w.add(j * ld), m);
        }
        for (i, row) in acc.iter_mut().enumerate() {
            let xv = _mm512_maskz_loadu_ps(m, x.add(i * ld));
            for (a, v) in row.iter_mut().zip(&wv) {
                *a = _mm512_fmadd_ps(xv, *v, *a);
            }
        }
    }
}

/// [`gemm_block`] for `c ≤ NR` weight rows.
///
/// # Safety
/// As [`gemm_block`] with `C = c`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn gemm_edge_block<const R: usize>(c: usize, b: Block) {
    // SAFETY: forwarded.
    unsafe {
        match c {
            1 => gemm_block::<R, 1>(b),
            2 => gemm_block::<R, 2>(b),
            3 => gemm_block::<R, 3>(b),
            _ => gemm_block::<R, NR>(b),
        }
    }
}

/// `y[i·ldy + j] = Σ_k x[i·k_len + k] · w[j·k_len + k]` for `m` rows of `x` and `n` bf16 weight
/// rows of `w` (both row-major with `k_len` columns). Each output element is one f32 dot
/// product, summed in sixteen lanes per `KC` pass, like the GEMV's.
///
/// # Safety
/// AVX-512F/BW/VL; `x.len() >= m·k_len`, `w.len() >= n·k_len`; `y` writable at `i·ldy + j` for
/// `i < m`, `j < n`, and not written by anyone else meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn gemm_bf16_avx512(
    x: &[f32],
    m: usize,
    k_len: usize,
    w: &[u16],
    n: usize,
    y: *mut f32,
    ldy: usize,
) {
    let mut k0 = 0;
    while k0 < k_len {
        let kc = KC.min(k_len - k0);
        // Row blocks as even as possible (128 rows: 18 of 6 and 4 of 5, not 21 of 6 and one of
        // 2, whose weight loads feed a third of the FMAs of a full block).
        let blocks = m.div_ceil(MR);
        let (base, extra) = (m / blocks.max(1), m % blocks.max(1));
        for b in 0..blocks {
            let r = base + usize::from(b < extra);
            let i0 = b * base + b.min(extra);
            for j0 in (0..n).step_by(NR) {
                let c = NR.min(n - j0);
                // SAFETY: the block's `r` rows of `x` and `c` rows of `w` lie inside the slices
                // (indices below m·k_len and n·k_len); `y` as this function's contract.
                unsafe {
                    let blk = Block {
                        x: x[i0 * k_len + k0..].as_ptr(),
                        w: w[j0 * k_len + k0..].as_ptr(),
                        ld: k_len,
                        kc,
                        y: y.add(i0 * ldy + j0),
                        ldy,
                        add: k0 > 0,
                    };
                    match r {
                        1 => gemm_edge_block::<1>(c, blk),
                        2 => gemm_edge_block::<2>(c, blk),
                        3 => gemm_edge_block::<3>(c, blk),
                        4 => gemm_edge_block::<4>(c, blk),
                        5 => gemm_edge_block::<5>(c, blk),
                        _ => gemm_edge_block::<MR>(c, blk),
                    }
                }
            }
        }
        k0 += kc;
    }
}

// ---------------------------------------------------------------------------------------------
// exp (softmax, SiLU): a prefill takes millions of them, and libm's one at a time was a fifth of
// a 128-token prefill.

/// `e^x` in 16 lanes: x = n·ln 2 + r with |r| ≤ ln 2 / 2 (Cody–Waite, ln 2 in two parts),
/// `e^r` by Cephes' degree-6 polynomial for `expf` (within 2 ulp of the rounded result), and
/// `vscalefps` for `2^n`, which overflows to +inf and underflows through the subnormals to 0 as
/// `expf` does. NaN lanes stay NaN.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5, // Cephes: 5.0000001201e-1, which is 0.5 in f32
    ];
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    // Past these bounds the result is 0 or +inf anyway; clamping keeps r finite for ±inf.
    let xc = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-104.0)),
        _mm512_set1_ps(89.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(P[0]);
    for &c in &P[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_fmadd_ps(
        p,
        _mm512_mul_ps(r, r),
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    _mm512_mask_mov_ps(_mm512_scalef_ps(y, n), nan, x)
}

/// `v[i] = e^v[i]` for every element.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn exp_in_place_avx512(v: &mut [f32]) {
    let mut chunks = v.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 16 f32.
        unsafe { _mm512_storeu_ps(c.as_mut_ptr(), exp16(_mm512_loadu_ps(c.as_ptr()))) };
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let m: __mmask16 = ((1u32 << rest.len()) - 1) as u16;
        // SAFETY: the masked lanes are the `rest.len()` < 16 elements of `rest`.
        unsafe {
            let e = exp16(_mm512_maskz_loadu_ps(m, rest.as_ptr()));
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), m, e);
        }
    }
}
