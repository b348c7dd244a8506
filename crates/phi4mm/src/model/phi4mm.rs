//! [`Phi4mm`]: the whole model on the host backend and its thread pool.

use super::audio::AudioEncoder;
use super::decoder::Decoder;
use super::vision::VisionEncoder;
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
