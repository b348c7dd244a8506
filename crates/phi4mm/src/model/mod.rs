//! The pure-Rust host backend: decoder with per-row LoRA, SigLIP vision tower, Conformer audio
//! encoder, projections and the multimodal merge.
//!
//! Entry points:
//! - [`Phi4mm::load`] builds every component from a validated [`Checkpoint`];
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
pub mod rope;
pub mod vision;

pub use audio::{AudioEncoder, AudioEncoding};
pub use decoder::Decoder;
pub use host_backend::HostBackend;
pub use kv_cache::SequenceState;
pub use media_stage::MediaStage;
pub use merge::{AudioInput, EncoderError, InputError, MediaEncoders, MergedPrompt, PromptInput};
pub use rope::RopeMode;
pub use vision::{ImageEncoding, ImageInput, VisionEncoder};

use crate::checkpoint::{Checkpoint, ModelConfig};

/// The whole model on the host backend. Weights stay memory-mapped in their stored precision.
pub struct Phi4mm {
    pub config: ModelConfig,
    pub decoder: Decoder,
    pub vision: VisionEncoder,
    pub audio: AudioEncoder,
    pool: rayon::ThreadPool,
}

impl Phi4mm {
    /// Builds the model on a pool of `threads` worker threads (0 = one per core).
    pub fn load(ck: &Checkpoint, threads: usize) -> Self {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("phi4mm-host-{i}"))
            .build()
            .expect("thread pool");
        Phi4mm {
            config: ck.config.clone(),
            decoder: Decoder::load(ck),
            vision: VisionEncoder::load(ck),
            audio: AudioEncoder::load(ck),
            pool,
        }
    }

    /// Runs `f` on this model's thread pool (all kernels parallelise over the current pool).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}
