//! The host backend's compute kernels, apart from the model code that calls them: linear layers
//! over weights in their stored precision ([`linear`], with the bf16 inner loops in `amx` (tiles, many rows),
//! `avx512` and `avx2`, chosen at run time by [`path`]), strided
//! f32 products for attention ([`matmul`]), and element-wise and normalisation ops ([`ops`]). All
//! compute in f32 in the reference's operation order, so the numbers equal an f32 model's.

#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod linear;
pub mod matmul;
pub mod ops;
pub mod path;
