//! Phi-4-multimodal-instruct ("Phi4MM") for Switchyard.
//!
//! Layout (see `docs/phi4mm.md`):
//! - front end, backend-neutral: [`audio`] (WAV → log-mel features), [`image`] (dynamic-HD crops),
//!   [`prompt`] (tokenizer, chat template, placeholders);
//! - [`checkpoint`]: safetensors loading for both layouts and validation before compute;
//! - [`model`]: the pure-Rust host backend (decoder, Conformer, SigLIP, projections);
//! - [`artifact_cache`]: the verified, crash-safe cache of compiled IREE modules; `iree` (feature
//!   `iree`): the IREE compiler wrapper.

pub mod artifact_cache;
pub mod audio;
pub mod backend;
pub mod checkpoint;
pub mod config;
pub mod image;
#[cfg(feature = "iree")]
pub mod iree;
pub mod limits;
pub mod model;
pub mod options;
pub mod plugin;
pub mod prompt;
pub mod request;
pub mod sampling;
pub mod scheduler;
