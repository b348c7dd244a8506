//! The pure-Rust host backend: decoder with per-row LoRA, SigLIP vision tower, Conformer audio
//! encoder, projections and the multimodal merge.
//!
//! Entry points:
//! - [`Phi4mm::load`] builds every component from a validated
//!   [`Checkpoint`](crate::checkpoint::Checkpoint);
//! - [`Phi4mm::prepare`] turns ids + media into prompt embeddings and the row's adapter/branch;
//! - [`Decoder::step`] runs a batch of rows (the scheduler's primitive);
//! - [`HostBackend`] is the model behind [`crate::step::StepBackend`] and its media stage, for the
//!   scheduler and [`crate::step::greedy`].

mod attention;
pub mod audio;
pub mod decoder;
mod encoder_layers;
mod host_backend;
pub mod kv_cache;
pub mod lora;
mod media_stage;
pub mod merge;
mod phi4mm;
pub mod rope;
pub mod vision;

pub use audio::{AudioEncoder, AudioEncoding};
pub use decoder::Decoder;
pub use host_backend::HostBackend;
pub use kv_cache::SequenceState;
pub use media_stage::MediaStage;
pub use merge::{AudioInput, EncoderError, InputError, MediaEncoders, MergedPrompt, PromptInput};
pub use phi4mm::Phi4mm;
pub use rope::RopeMode;
pub use vision::{ImageEncoding, ImageInput, VisionEncoder};
