//! The host model as a backend: its decoder behind [`StepBackend`] and its own encoders behind the
//! media stage.

use std::sync::Arc;

use crate::step::{StepBackend, StepRow};

use super::kv_cache::SequenceState;
use super::media_stage::MediaStage;
use super::phi4mm::Phi4mm;

/// The host backend: [`Phi4mm`]'s decoder on the model's own thread pool.
pub struct HostBackend(pub Arc<Phi4mm>);

impl HostBackend {
    /// Validation, the host encoders and the placeholder merge. The encoders run on the calling
    /// (media) pool, so a large image does not take the decoder's threads from running rows.
    pub fn media_stage(&self) -> MediaStage {
        let context = self.0.config.text.max_position_embeddings;
        MediaStage::new(self.0.clone(), self.0.clone(), context)
    }
}

impl StepBackend for HostBackend {
    type State = SequenceState;

    fn new_state(&self) -> SequenceState {
        self.0.decoder.new_sequence()
    }

    fn embed(&self, ids: &[u32]) -> Vec<f32> {
        self.0.decoder.embed(ids)
    }

    fn step(&self, rows: &mut [StepRow<'_, SequenceState>]) -> Vec<Vec<f32>> {
        let model = &self.0;
        model.install(|| model.decoder.step(rows))
    }

    fn kv_bytes(&self, positions: usize) -> usize {
        super::kv_cache::row_bytes(&self.0.config.text, positions)
    }
}
