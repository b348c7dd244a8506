//! The MLX producer (cargo feature `mlx`, setting `producer = "mlx"`): MLX embeds the prompt's
//! token ids and runs the vision tower with its projector, from a filtered view of the checkpoint
//! ([`weights`]); the audio encoder and the decoder stay on the chosen backend. The producer is
//! qualified when it starts ([`qualify`]): MLX's embeddings and vision features must match the host
//! model's within [`qualify::TOLERANCE`], or the instance refuses to start.

pub mod qualify;
pub mod vision;
pub mod weights;

use std::sync::{Arc, Mutex};

use mlx_rs::Array;

use crate::adapter::AudioBranch;
use crate::checkpoint::Checkpoint;
use crate::model::{AudioEncoding, EncoderError, ImageEncoding, ImageInput, MediaEncoders, Phi4mm};

use vision::MlxVision;
use weights::{MlxWeights, EMBED_TABLE};

/// Why the MLX producer could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum MlxError {
    #[error("producer \"mlx\": {0}")]
    Start(String),
    #[error("producer \"mlx\": MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    #[error(
        "producer \"mlx\" failed qualification: {what} differ from the host model's by {diff:e} \
         (more than {tolerance:e})"
    )]
    Unqualified {
        what: String,
        diff: f32,
        tolerance: f32,
    },
}

/// What MLX holds: the embedding table (stored precision) and the vision tower (f32).
struct MlxModel {
    embed: Array,
    vision: MlxVision,
}

/// The MLX producer as a backend's media encoders: images and token embeddings on MLX, audio on
/// the backend's own encoder.
pub struct MlxProducer {
    /// MLX arrays are `Send` but not `Sync`, and MLX's graph evaluation is not meant for several
    /// threads at once: one media job at a time uses MLX.
    mlx: Mutex<MlxModel>,
    /// The host model: the HD layout rule and the shape checks.
    host: Arc<Phi4mm>,
    /// The backend's encoders, which keep the audio.
    audio: Arc<dyn MediaEncoders + Send + Sync>,
}

impl MlxProducer {
    /// Loads the filtered view onto MLX, then qualifies it against the host model.
    pub fn start(
        ck: &Checkpoint,
        host: Arc<Phi4mm>,
        audio: Arc<dyn MediaEncoders + Send + Sync>,
    ) -> Result<Self, MlxError> {
        let weights = MlxWeights::load(ck);
        let model = MlxModel {
            embed: weights.get(EMBED_TABLE)?.clone(),
            vision: MlxVision::load(&weights, &ck.config.vision)?,
        };
        let producer = MlxProducer {
            mlx: Mutex::new(model),
            host,
            audio,
        };
        qualify::qualify(&producer)?;
        Ok(producer)
    }

    /// Token embeddings `[ids.len(), hidden]` on MLX.
    pub fn embed(&self, ids: &[u32]) -> Result<Vec<f32>, MlxError> {
        let vocab = self.host.config.text.vocab_size;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            // Validated at admission; MLX's gather would not bounds-check.
            return Err(MlxError::Start(format!(
                "token id {id} outside the vocabulary ({vocab})"
            )));
        }
        let mlx = self.lock();
        let ids = Array::from_slice(ids, &[ids.len() as i32]);
        vision::to_vec(&mlx.embed.take_axis(&ids, 0)?)
    }

    /// The vision tower and projector on MLX.
    pub fn encode_image(&self, image: &ImageInput) -> Result<ImageEncoding, MlxError> {
        let mlx = self.lock();
        mlx.vision.encode(self.host.vision.hd(), image)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MlxModel> {
        // A panic inside MLX leaves no half-written state behind (every call builds a fresh graph).
        self.mlx.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MediaEncoders for MlxProducer {
    fn encode_image(&self, image: &ImageInput) -> Result<ImageEncoding, EncoderError> {
        Ok(MlxProducer::encode_image(self, image)?)
    }

    fn encode_audio(
        &self,
        features: &[f32],
        frames: usize,
        branch: AudioBranch,
    ) -> Result<AudioEncoding, EncoderError> {
        self.audio.encode_audio(features, frames, branch)
    }

    fn embed_tokens(&self, ids: &[u32]) -> Option<Result<Vec<f32>, EncoderError>> {
        Some(self.embed(ids).map_err(Into::into))
    }
}
