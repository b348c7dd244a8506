//! The media stage as the scheduler runs it: a job's prepare function, which validates the
//! request, runs a backend's encoders and merges their rows over the placeholders on the
//! scheduler's media pool. Both backends share it; only the encoders and the context differ.

use std::sync::Arc;

use crate::scheduler::{PrepareFn, RowError, RowPrompt};

use super::merge::{MediaEncoders, MergedPrompt, PromptInput};
use super::phi4mm::Phi4mm;

/// One backend's media stage. Cheap to clone (it holds `Arc`s).
#[derive(Clone)]
pub struct MediaStage {
    /// The host model: validation, token embeddings and the merge, whichever backend decodes.
    model: Arc<Phi4mm>,
    encoders: Arc<dyn MediaEncoders + Send + Sync>,
    /// Longest prompt + new tokens the backend's rows hold.
    context: usize,
}

impl MediaStage {
    pub fn new(
        model: Arc<Phi4mm>,
        encoders: Arc<dyn MediaEncoders + Send + Sync>,
        context: usize,
    ) -> Self {
        MediaStage {
            model,
            encoders,
            context,
        }
    }

    /// Longest prompt + new tokens one row holds: its KV cache's capacity in positions.
    pub fn context(&self) -> usize {
        self.context
    }

    /// The encoders this stage runs media through.
    pub fn encoders(&self) -> Arc<dyn MediaEncoders + Send + Sync> {
        self.encoders.clone()
    }

    /// The same stage over other encoders (a producer in front of the backend's own).
    pub fn with_encoders(self, encoders: Arc<dyn MediaEncoders + Send + Sync>) -> Self {
        MediaStage { encoders, ..self }
    }

    /// The prepare function of a job for `input`.
    pub fn prepare_fn(&self, input: PromptInput, max_new_tokens: usize) -> PrepareFn {
        let stage = self.clone();
        Box::new(move || {
            stage
                .model
                .prepare_with(&input, max_new_tokens, &*stage.encoders, stage.context)
                .map(RowPrompt::from)
                .map_err(|e| RowError::Invalid(e.to_string()))
        })
    }
}

/// The scheduler keeps what a row decodes from; the encoder outputs (kept for inspection) are
/// dropped before the prompt waits for a slot.
impl From<MergedPrompt> for RowPrompt {
    fn from(p: MergedPrompt) -> Self {
        RowPrompt {
            prompt_tokens: p.len,
            embeds: p.embeds,
            adapter: p.adapter,
            audio_branch: p.audio_branch,
        }
    }
}
