//! Many-row bf16 products on AMX tiles (Intel's Advanced Matrix Extensions): the GEMMs of the
//! prefill and the encoders, which the AVX-512 path runs at its FMA peak.
//!
//! AMX multiplies bf16 by bf16 into f32 sums. The weights are bf16 already. The activations are
//! f32, and they stay f32: each is split exactly into three bf16 parts, `hi + mid + lo`, by
//! truncation (eight significant bits each, 24 in all: an f32's whole significand), and the
//! product is the sum of the three tile products. A bf16 × bf16 product is exact in f32 and
//! the tiles sum in f32, so the result is an f32 GEMM's up to the order of summation, as on the
//! other paths. (AMX reads subnormal parts as zero: an activation's parts below 2^-126 are
//! lost, an absolute error under 1e-38 of each product.) Three parts cost three tile products;
//! AMX's throughput per cycle is so much higher than the FMA units' that this still pays.
//!
//! Layout. The weights are the tile product's left operand (16 weight rows × 32 values of k, read
//! where they lie in the mapped checkpoint), the activations its right operand, which AMX wants
//! as pairs of k ("VNNI" layout: 16 pairs of k × 16 input rows). So no weight is ever repacked:
//! the activations, far fewer values than the weights in a prefill, are split and packed once
//! per product ([`pack`]), and each 16 × 16 block of sums (output features × input rows) is
//! transposed into the row-major output on the way out.
//!
//! The instructions are written as inline assembly, for Rust's AMX intrinsics are unstable. Linux
//! gives a process AMX state only after `arch_prctl(ARCH_REQ_XCOMP_PERM)`, which [`supported`]
//! asks for once.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use rayon::prelude::*;

/// bf16 parts per activation.
const PARTS: usize = 3;

/// Values of k per tile row: 64 bytes of bf16.
const K_TILE: usize = 32;

/// One 64-byte tile row.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Line([u32; 16]);

const ZERO_LINE: Line = Line([0; 16]);

/// Whether this CPU has AMX-TILE and AMX-BF16 and the kernel lets this process use them.
pub fn supported() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
        // Safe to call in newer Rust; the block keeps the workspace's rust-version building.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID exists on every x86-64 CPU.
        let edx = unsafe { __cpuid_count(7, 0) }.edx;
        edx & (1 << 22) != 0 && edx & (1 << 24) != 0 && request_tile_state()
    })
}

/// Asks Linux for the tile data state (XTILEDATA), process-wide; false if refused.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: this arch_prctl request takes two integers and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// The activations of one product, split into bf16 parts and packed as right-hand tiles: for
/// each block of 16 input rows `j`, each chunk of 32 values of k `c` and each part `p`, one tile
/// of 16 lines (line `q` holds pair `q` of the chunk for each of the 16 rows). Rows past the end
/// and values of k past `k` are zeros; there is an even number of row blocks.
pub struct Packed {
    lines: Vec<Line>,
    chunks: usize,
}

impl Packed {
    fn tile(&self, block: usize, chunk: usize, part: usize) -> *const Line {
        self.lines[((block * self.chunks + chunk) * PARTS + part) * 16..].as_ptr()
    }
}

thread_local! {
    /// The last product's packing buffer, kept for the next one on this thread: a prefill
    /// packs a few hundred KiB to a few MiB per product, and a fresh buffer would be faulted in
    /// page by page every time. (Taken, not borrowed: a nested product on the same thread, as
    /// rayon's work stealing can start, finds it empty and allocates its own.)
    static SPARE: std::cell::Cell<Vec<Line>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Drop for Packed {
    fn drop(&mut self) {
        SPARE.set(std::mem::take(&mut self.lines));
    }
}

/// Splits and packs `x` (`[rows, k]`, row-major) for [`gemm_bf16_amx`], the blocks in parallel.
///
/// # Safety
/// The CPU must support AVX-512F/BW (the AMX path implies it).
pub unsafe fn pack(x: &[f32], rows: usize, k: usize) -> Packed {
    assert!(x.len() >= rows * k, "amx pack: input size");
    let chunks = k.div_ceil(K_TILE);
    let per_block = chunks * PARTS * 16;
    let total = rows.div_ceil(32) * 2 * per_block;
    let mut lines = SPARE.take();
    lines.clear();
    lines.reserve(total);
    lines.spare_capacity_mut()[..total]
        .par_chunks_mut(per_block)
        .enumerate()
        .for_each(|(block, out)| {
            // SAFETY: AVX-512 as the caller guarantees; `out` is this block's region.
            unsafe { pack_block(x, rows, k, block, out) }
        });
    // SAFETY: `pack_block` wrote every line of every block (zeros past the rows and past k).
    unsafe { lines.set_len(total) };
    Packed { lines, chunks }
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_block(
    x: &[f32],
    rows: usize,
    k: usize,
    block: usize,
    out: &mut [std::mem::MaybeUninit<Line>],
) {
    let chunks = k.div_ceil(K_TILE);
    // u16 lane t of the result takes the high half of value t of the 32 (a's 16, then b's 16).
    let odd_halves = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19,
        17, 15, 13, 11, 9, 7, 5, 3, 1,
    );
    let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    for c in 0..chunks {
        let k0 = c * K_TILE;
        let kn = (k - k0).min(K_TILE);
        let (m0, m1) = (lane_mask(kn.min(16)), lane_mask(kn.saturating_sub(16)));
        for p in 0..PARTS {
            let mut v = [_mm512_setzero_si512(); 16];
            for (i, vi) in v.iter_mut().enumerate() {
                let r = block * 16 + i;
                if r >= rows {
                    break;
                }
                // SAFETY: row r < rows and the masks keep the loads inside k0..k of that row.
                let (a, b) = unsafe {
                    let base = x.as_ptr().add(r * k + k0);
                    (
                        _mm512_maskz_loadu_ps(m0, base),
                        _mm512_maskz_loadu_ps(m1, base.add(16)),
                    )
                };
                let (a, b) = (part(a, p, high), part(b, p, high));
                *vi = _mm512_permutex2var_epi16(a, odd_halves, b);
            }
            transpose16(&mut v);
            let tile = &mut out[(c * PARTS + p) * 16..][..16];
            for (line, vq) in tile.iter_mut().zip(v) {
                // SAFETY: a `Line` is 64 aligned bytes; the store initialises all of it.
                unsafe { _mm512_store_si512(line.as_mut_ptr().cast(), vq) };
            }
        }
    }
}

/// The bits of part `p` of each f32 (its high 16 bits are the bf16 part; the low ones are
/// ignored): `hi` is the value truncated to bf16, `mid` the remainder truncated, `lo` the rest,
/// which has at most eight significant bits and so is exact.
#[inline]
#[target_feature(enable = "avx512f")]
fn part(v: __m512, p: usize, high: __m512i) -> __m512i {
    let trunc = |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), high));
    let mut v = v;
    for _ in 0..p {
        v = _mm512_sub_ps(v, trunc(v));
    }
    _mm512_castps_si512(v)
}

/// The first `n` of 16 lanes.
#[inline]
fn lane_mask(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// `permutex2var` indices of [`transpose16`]'s four steps: for the swap of blocks of `s` lanes
/// (s = 8, 4, 2, 1), the new row i (`[2 * step]`) and the new row i + s (`[2 * step + 1]`).
/// Lanes 16.. of an index pick from the second operand.
const TRANSPOSE_INDEX: [[i32; 16]; 8] = {
    let mut idx = [[0i32; 16]; 8];
    let mut step = 0;
    while step < 4 {
        let s = 8 >> step;
        let mut c = 0;
        while c < 16 {
            let set = c & s != 0;
            // Row i keeps its columns with bit s clear and takes row i+s's where it is set;
            // row i+s the other way round.
            idx[2 * step][c] = if set { 16 + c - s } else { c } as i32;
            idx[2 * step + 1][c] = if set { 16 + c } else { c + s } as i32;
            c += 1;
        }
        step += 1;
    }
    idx
};

/// Transposes 16 rows of 16 32-bit lanes in registers: the off-diagonal blocks of 8, 4, 2 and
/// then 1 lanes swap places (an element moves where its row's and column's bits differ).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(v: &mut [__m512i; 16]) {
    for step in 0..4 {
        let s = 8 >> step;
        // SAFETY: plain loads of constant arrays of 16 i32.
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_si512(TRANSPOSE_INDEX[2 * step].as_ptr().cast()),
                _mm512_loadu_si512(TRANSPOSE_INDEX[2 * step + 1].as_ptr().cast()),
            )
        };
        for i in 0..16 {
            if i & s == 0 {
                let (a, b) = (v[i], v[i + s]);
                v[i] = _mm512_permutex2var_epi32(a, lo, b);
                v[i + s] = _mm512_permutex2var_epi32(a, hi, b);
            }
        }
    }
}

/// The 64-byte tile configuration: palette 1, every tile 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Loads the one tile configuration both users share (palette 1, tiles 0–7 each 16 rows of 64
/// bytes) on the calling thread.
///
/// # Safety
/// [`supported`] holds.
unsafe fn configure_tiles() {
    let mut config = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    config.colsb[..8].fill(64);
    config.rows[..8].fill(16);
    // SAFETY: the caller guarantees AMX; `ldtilecfg` reads the 64 bytes of `config`.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
}

/// `y[r0 + i, j] = Σ_k w[j, k] · x[r0 + i, k]` for the `m` input rows from `r0` (a multiple of
/// 32) of the packed activations `x` and the `n` bf16 weight rows `w` (`[n, k]`); `y` has row
/// stride `ldy`.
///
/// Tiles: 0–3 hold the sums of two blocks of 16 weight rows × two blocks of 16 input rows, 4
/// and 5 the two weight blocks' current 32 values of k, 6 and 7 the two input blocks' current
/// part. Per chunk of k: 2 weight loads, 6 activation loads, 12 tile products. The input blocks
/// are the outer loop, so one pair's packed rows stay in L2 while the task's weights (at most
/// 512 KiB, see `linear::tile_rows`) stream past them.
///
/// # Safety
/// [`supported`] and AVX-512F/BW hold; `x` packs `k` and at least `r0 + m` rows; `w.len() >=
/// n * k`; `y` is valid for writes at `(r0 + i) * ldy + j` for `i < m`, `j < n`, and nothing else
/// accesses those elements during the call.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn gemm_bf16_amx(
    x: &Packed,
    r0: usize,
    m: usize,
    w: &[u16],
    n: usize,
    k: usize,
    y: *mut f32,
    ldy: usize,
) {
    assert!(r0.is_multiple_of(32) && w.len() >= n * k && x.chunks == k.div_ceil(K_TILE));
    let chunks = x.chunks;
    // The weights straight from the checkpoint where whole tiles fit; otherwise (k not a multiple
    // of 32, or a last block of fewer than 16 rows) a copy padded with zeros, so that no tile
    // load reads past a row or the matrix.
    let padded: Vec<u16>;
    let (wp, ldw) = if k.is_multiple_of(K_TILE) && n.is_multiple_of(16) {
        (w.as_ptr(), k)
    } else {
        let ldw = chunks * K_TILE;
        let mut p = vec![0u16; n.div_ceil(16) * 16 * ldw];
        for (dst, src) in p.chunks_mut(ldw).zip(w.chunks(k).take(n)) {
            dst[..k].copy_from_slice(src);
        }
        padded = p;
        (padded.as_ptr(), ldw)
    };
    let wstride = ldw * 2;
    let nblocks = n.div_ceil(16);
    let mut sums = [[ZERO_LINE; 16]; 4];
    // SAFETY: the tile loads read 16 lines of 64 bytes from `wp` at stride `wstride` inside
    // the (padded) weights' `nblocks * 16` rows, and 16 lines of a packed tile; the stores write
    // the local `sums`. The caller guarantees AMX (`supported`) and the output region.
    unsafe {
        configure_tiles();
        for pair in 0..m.div_ceil(32) {
            let (ja, jb) = (r0 / 16 + 2 * pair, r0 / 16 + 2 * pair + 1);
            for nb in (0..nblocks).step_by(2) {
                let two = nb + 1 < nblocks;
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
                for c in 0..chunks {
                    let a = wp.add(nb * 16 * ldw + c * K_TILE);
                    asm!("tileloadd tmm4, [{p} + {s}]", p = in(reg) a, s = in(reg) wstride, options(nostack, readonly));
                    if two {
                        let a = a.add(16 * ldw);
                        asm!("tileloadd tmm5, [{p} + {s}]", p = in(reg) a, s = in(reg) wstride, options(nostack, readonly));
                    }
                    for p in 0..PARTS {
                        asm!(
                            "tileloadd tmm6, [{a} + {s}]",
                            "tileloadd tmm7, [{b} + {s}]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            a = in(reg) x.tile(ja, c, p),
                            b = in(reg) x.tile(jb, c, p),
                            s = in(reg) 64usize,
                            options(nostack, readonly),
                        );
                        if two {
                            asm!(
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                options(nostack, nomem)
                            );
                        }
                    }
                }
                asm!(
                    "tilestored [{t0} + {s}], tmm0",
                    "tilestored [{t1} + {s}], tmm1",
                    "tilestored [{t2} + {s}], tmm2",
                    "tilestored [{t3} + {s}], tmm3",
                    t0 = in(reg) sums[0].as_mut_ptr(),
                    t1 = in(reg) sums[1].as_mut_ptr(),
                    t2 = in(reg) sums[2].as_mut_ptr(),
                    t3 = in(reg) sums[3].as_mut_ptr(),
                    s = in(reg) 64usize,
                    options(nostack),
                );
                // Tile t: weight block nb + t / 2, input block (ja, jb)[t % 2].
                for (t, tile) in sums.iter().enumerate().take(if two { 4 } else { 2 }) {
                    let col = (nb + t / 2) * 16;
                    let row = r0 + (2 * pair + t % 2) * 16;
                    write_transposed(
                        tile,
                        y,
                        ldy,
                        row,
                        (r0 + m).saturating_sub(row),
                        col,
                        n - col,
                    );
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// bf16 floating-point operations in one tile product (16 × 16 sums of 32 products).
pub const FLOPS_PER_TILE_PRODUCT: usize = 16 * 16 * 32 * 2;

/// The compute bound of the tile unit for benchmarks: `rounds` rounds of six independent tile
/// products on registers alone, on the calling thread (`6 * rounds` products of
/// [`FLOPS_PER_TILE_PRODUCT`]). An f32 product through [`gemm_bf16_amx`] costs three of them.
///
/// # Safety
/// [`supported`] holds.
pub unsafe fn tile_products(rounds: usize) {
    // SAFETY: the caller guarantees AMX; only tile registers are touched after the
    // configuration is read. Zero tiles multiply to zeros: the rate does not depend on values.
    unsafe {
        configure_tiles();
        asm!("tilezero tmm6", "tilezero tmm7", options(nostack, nomem));
        for _ in 0..rounds {
            asm!(
                "tdpbf16ps tmm0, tmm6, tmm7",
                "tdpbf16ps tmm1, tmm6, tmm7",
                "tdpbf16ps tmm2, tmm6, tmm7",
                "tdpbf16ps tmm3, tmm6, tmm7",
                "tdpbf16ps tmm4, tmm6, tmm7",
                "tdpbf16ps tmm5, tmm6, tmm7",
                options(nostack, nomem),
            );
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// Writes the 16 × 16 sums `tile` (line = output feature, lane = input row) transposed into `y`
/// at rows `row..`, columns `col..`: at most `rows` rows and `cols` columns of it.
///
/// # Safety
/// As for [`gemm_bf16_amx`]'s output region.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn write_transposed(
    tile: &[Line; 16],
    y: *mut f32,
    ldy: usize,
    row: usize,
    rows: usize,
    col: usize,
    cols: usize,
) {
    // SAFETY: `Line`s are 64 aligned bytes; the stores stay in rows row..row+rows and columns
    // col..col+cols, which the caller owns.
    unsafe {
        let mut v = [_mm512_setzero_si512(); 16];
        for (vi, line) in v.iter_mut().zip(tile) {
            *vi = _mm512_load_si512(line.0.as_ptr().cast());
        }
        transpose16(&mut v);
        let mask = lane_mask(cols.min(16));
        for (i, vi) in v.iter().enumerate().take(rows.min(16)) {
            _mm512_mask_storeu_epi32(y.add((row + i) * ldy + col).cast(), mask, *vi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::linear::tests::lcg;

    fn avx512() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
    }

    #[test]
    fn the_three_parts_sum_exactly_to_the_value() {
        if !avx512() {
            eprintln!("SKIPPED: no AVX-512; the split test did not run");
            return;
        }
        let mut seed = 7;
        let xs: Vec<f32> = (0..4096)
            .map(|i| lcg(&mut seed) * 10f32.powi(i % 13 - 6))
            .chain([1.0, -0.0, 3.0e38, 1.0e-30, f32::MIN_POSITIVE])
            .collect();
        // SAFETY: AVX-512 checked above.
        let high = unsafe { _mm512_set1_epi32(0xffff_0000_u32 as i32) };
        for chunk in xs.chunks(16) {
            let mut buf = [0f32; 16];
            buf[..chunk.len()].copy_from_slice(chunk);
            let parts: Vec<[u32; 16]> = (0..PARTS)
                .map(|p| {
                    let mut out = [0u32; 16];
                    // SAFETY: AVX-512 checked above; 16-lane loads/stores of local arrays.
                    unsafe {
                        let v = part(_mm512_loadu_ps(buf.as_ptr()), p, high);
                        _mm512_storeu_si512(out.as_mut_ptr().cast(), v);
                    }
                    out
                })
                .collect();
            for (i, &want) in buf.iter().enumerate() {
                let bf = |p: usize| f32::from_bits(parts[p][i] & 0xffff_0000);
                // Each part is a bf16 (the low half is dropped), and they sum back exactly.
                let got = (bf(0) as f64) + (bf(1) as f64) + (bf(2) as f64);
                assert_eq!(got, want as f64, "value {want:e}");
            }
        }
    }

    #[test]
    fn transpose16_transposes() {
        if !avx512() {
            eprintln!("SKIPPED: no AVX-512; the transpose test did not run");
            return;
        }
        let src: Vec<u32> = (0..256).collect();
        // SAFETY: AVX-512 checked above.
        let mut v = [unsafe { _mm512_setzero_si512() }; 16];
        let mut out = [[0u32; 16]; 16];
        // SAFETY: AVX-512 checked above; loads and stores of local arrays of 16 u32.
        unsafe {
            for (i, vi) in v.iter_mut().enumerate() {
                *vi = _mm512_loadu_si512(src[i * 16..].as_ptr().cast());
            }
            transpose16(&mut v);
            for (o, vi) in out.iter_mut().zip(v) {
                _mm512_storeu_si512(o.as_mut_ptr().cast(), vi);
            }
        }
        for (r, row) in out.iter().enumerate() {
            for (c, &e) in row.iter().enumerate() {
                assert_eq!(e, (c * 16 + r) as u32, "({r}, {c})");
            }
        }
    }
}
