//! Phi-4-multimodal-instruct ("Phi4MM") for Switchyard: the plugin library.
//!
//! The front end (audio, images, prompt) is the `switchyard-phi4mm-frontend` crate and the
//! compiled-module cache is `switchyard-artifact-cache`; this crate holds what turns their output
//! into tokens:
//! - [`checkpoint`]: safetensors loading for both layouts, validated before any compute;
//! - [`model`]: the pure-Rust host backend (decoder, Conformer, SigLIP, projections), the
//!   numerical reference, over the CPU [`kernels`];
//! - `iree` (feature `iree`): the same model as IREE-compiled modules;
//! - `mlx` (feature `mlx`): the MLX producer of token embeddings and image rows, in front of
//!   either backend;
//! - [`backend`]: choosing and starting one of the two, and the producer;
//! - [`step`]: the batched decoder step both backends implement, and greedy decoding over it;
//! - [`scheduler`]: continuous batching with a per-row adapter, over either backend;
//! - [`adapter`]: the per-row LoRA adapter and audio branch, and a request's choice of them;
//! - [`sampling`]: temperature, top-k/top-p and log probabilities per row;
//! - [`request`]: a validated request turned into model inputs;
//! - [`plugin`], [`config`], [`options`]: the ABI surface, the instance settings, and the
//!   per-request `model_options`;
//! - [`huge_pages`]: the library's global allocator (huge pages for large blocks).
//!
//! `ARCHITECTURE.md` at the repository root is the map.

pub mod adapter;
pub mod backend;
pub mod checkpoint;
pub mod config;
pub mod huge_pages;
#[cfg(feature = "iree")]
pub mod iree;
pub mod kernels;
#[cfg(feature = "mlx")]
pub mod mlx;
pub mod model;
pub mod options;
pub mod plugin;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod step;

#[global_allocator]
static ALLOCATOR: huge_pages::LargeBlocksInHugePages = huge_pages::LargeBlocksInHugePages;
