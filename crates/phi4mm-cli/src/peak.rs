//! The compute bound of this CPU: f32 FMA throughput on registers alone, on every thread, on the
//! widest vector path it has; or, when the kernels run on AMX tiles, the tiles' throughput on
//! registers alone divided by three (an f32 product there is three bf16 tile products). A GEMM
//! cannot beat it, so prefill and encoder figures are reported as fractions of it, measured in
//! the same run (the machines are shared and their clocks move).

use std::time::Instant;

use rayon::prelude::*;

/// Independent accumulator chains: enough to cover the FMA latency on both FMA ports.
const CHAINS: usize = 12;
const ITERS: usize = 20_000_000;

/// Peak f32 GFLOP/s over the current rayon pool's threads (best of 3), and the unit used
/// (`"amx"` when the active kernel path is AMX, else the vector width: `"avx512"`, `"avx2"`, or
/// `"scalar"` where neither exists).
pub fn peak_gflops() -> (f64, &'static str) {
    #[cfg(target_arch = "x86_64")]
    if switchyard_phi4mm::kernels::path::active()
        == switchyard_phi4mm::kernels::path::KernelPath::Amx
    {
        return (amx_peak_gflops(), "amx");
    }
    let (lanes, name, run): (usize, _, fn(usize) -> f32) = widest();
    let threads = rayon::current_num_threads();
    let flops = (2 * CHAINS * lanes * ITERS * threads) as f64;
    let best = (0..3)
        .map(|_| {
            let t = Instant::now();
            let s: f32 = (0..threads).into_par_iter().map(|_| run(ITERS)).sum();
            std::hint::black_box(s);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    (flops / best / 1e9, name)
}

/// The tiles' bf16 peak over the pool's threads (best of 3), as f32 GFLOP/s: a third of it.
#[cfg(target_arch = "x86_64")]
fn amx_peak_gflops() -> f64 {
    use switchyard_phi4mm::kernels::amx;
    const ROUNDS: usize = 2_000_000;
    let threads = rayon::current_num_threads();
    let flops = (6 * ROUNDS * amx::FLOPS_PER_TILE_PRODUCT * threads) as f64 / 3.0;
    let best = (0..3)
        .map(|_| {
            let t = Instant::now();
            (0..threads).into_par_iter().for_each(|_| {
                // SAFETY: the active path is AMX, which is only chosen where it is supported.
                unsafe { amx::tile_products(ROUNDS) }
            });
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    flops / best / 1e9
}

#[cfg(target_arch = "x86_64")]
fn widest() -> (usize, &'static str, fn(usize) -> f32) {
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected just above.
        (16, "avx512", |n| unsafe { x86::fma_avx512(n) })
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected just above.
        (8, "avx2", |n| unsafe { x86::fma_avx2(n) })
    } else {
        (1, "scalar", fma_scalar)
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn widest() -> (usize, &'static str, fn(usize) -> f32) {
    (1, "scalar", fma_scalar)
}

fn fma_scalar(n: usize) -> f32 {
    let mut acc = [0f32; CHAINS];
    let (a, b) = (
        std::hint::black_box(1.000_000_1f32),
        std::hint::black_box(0.999_999_9f32),
    );
    for _ in 0..n {
        for r in &mut acc {
            *r = r.mul_add(a, b);
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub fn fma_avx512(n: usize) -> f32 {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        let a = _mm512_set1_ps(std::hint::black_box(1.000_000_1));
        let b = _mm512_set1_ps(std::hint::black_box(0.999_999_9));
        for _ in 0..n {
            for r in &mut acc {
                *r = _mm512_fmadd_ps(*r, a, b);
            }
        }
        let s = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, &r| _mm512_add_ps(s, r));
        _mm512_reduce_add_ps(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn fma_avx2(n: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        let a = _mm256_set1_ps(std::hint::black_box(1.000_000_1));
        let b = _mm256_set1_ps(std::hint::black_box(0.999_999_9));
        for _ in 0..n {
            for r in &mut acc {
                *r = _mm256_fmadd_ps(*r, a, b);
            }
        }
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &r| _mm256_add_ps(s, r));
        let half = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
        _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)))
    }
}
