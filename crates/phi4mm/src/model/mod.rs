//! The pure-Rust host backend: decoder with per-row LoRA, SigLIP vision tower, Conformer audio
//! encoder, projections, multimodal merge and greedy decoding.
//!
//! Entry points:
//! - [`Phi4mm::load`] builds every component from a validated [`Checkpoint`];
//! - [`Phi4mm::prepare`] turns ids + media into prompt embeddings and the row's adapter/branch;
//! - [`Decoder::step`] runs a batch of rows (the scheduler's primitive);
//! - [`Phi4mm::generate`] is greedy decoding of one prepared prompt (a batch of one).

pub mod audio;
pub mod decoder;
mod encoder_layers;
pub mod kv_cache;
pub mod linear;
pub mod lora;
pub mod merge;
pub mod ops;
pub mod rope;
pub mod vision;

pub use audio::{AudioEncoder, AudioEncoding};
pub use decoder::{Decoder, RowStep};
pub use kv_cache::SequenceState;
pub use merge::{AudioInput, InputError, MediaEncoders, PreparedPrompt, PromptInput};
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

/// Result of greedy generation for one prompt.
#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// Logits at the last prompt position.
    pub logits_first: Vec<f32>,
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

    /// Greedy decoding: prefill, then one token per step until `max_new_tokens` or a stop id
    /// (`stop_ids` empty = never stop early).
    pub fn generate(
        &self,
        prompt: &PreparedPrompt,
        max_new_tokens: usize,
        stop_ids: &[u32],
    ) -> Generation {
        self.install(|| {
            let mut state = self.decoder.new_sequence();
            let mut logits = self
                .decoder
                .step(&mut [RowStep {
                    state: &mut state,
                    embeds: &prompt.embeds,
                    adapter: prompt.adapter,
                }])
                .remove(0);
            let logits_first = logits.clone();
            let mut tokens = Vec::new();
            while tokens.len() < max_new_tokens {
                let next = argmax(&logits);
                tokens.push(next);
                if stop_ids.contains(&next) || tokens.len() == max_new_tokens {
                    break;
                }
                let e = self.decoder.embed(&[next]);
                logits = self
                    .decoder
                    .step(&mut [RowStep {
                        state: &mut state,
                        embeds: &e,
                        adapter: prompt.adapter,
                    }])
                    .remove(0);
            }
            Generation {
                tokens,
                logits_first,
            }
        })
    }
}

/// Index of the largest logit (first one on ties, like `torch.argmax`).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}
