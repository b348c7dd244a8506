//! The one thing the scheduler needs from a model: a batched decoder step over independent rows.
//! The scheduler is generic over [`StepBackend`], so it does not know whether the rows run on the
//! pure-Rust host backend or on another one.

use std::sync::Arc;

use crate::adapter::AdapterMode;
use crate::model::{Phi4mm, PromptInput, RowStep, SequenceState};

use super::{PrepareFn, Prepared, RowError};

/// One row of a batched step: the row's own decoder state, its new input embeddings and its
/// adapter.
pub struct StepRow<'a, S> {
    pub state: &'a mut S,
    /// `[n, hidden]`, n ≥ 1.
    pub embeds: &'a [f32],
    pub adapter: AdapterMode,
}

pub trait StepBackend: Send + Sync + 'static {
    /// Per-row decoder state (position, KV cache). A fresh one per admitted request, so a reused
    /// slot cannot see anything of its previous occupant.
    type State: Send + 'static;

    fn new_state(&self) -> Self::State;

    /// Token embeddings `[ids.len(), hidden]`.
    fn embed(&self, ids: &[u32]) -> Vec<f32>;

    /// Runs every row's new tokens and returns the logits of each row's last token.
    fn step(&self, rows: &mut [StepRow<'_, Self::State>]) -> Vec<Vec<f32>>;
}

/// The host backend: [`Phi4mm`]'s decoder on the model's own thread pool.
pub struct HostBackend(pub Arc<Phi4mm>);

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
        let mut steps: Vec<RowStep> = rows
            .iter_mut()
            .map(|r| RowStep {
                state: &mut *r.state,
                embeds: r.embeds,
                adapter: r.adapter,
            })
            .collect();
        model.install(|| model.decoder.step(&mut steps))
    }
}

/// The media stage of a backend: what turns a request into decoder input (validation, encoders,
/// placeholder merge). It runs on the scheduler's media pool, never on the decoder's thread.
pub trait MediaStage: Send + Sync {
    fn prepare_fn(&self, input: PromptInput, max_new_tokens: usize) -> PrepareFn;
}

impl MediaStage for HostBackend {
    /// Validation, encoders and placeholder merge, run on the calling (media) pool.
    fn prepare_fn(&self, input: PromptInput, max_new_tokens: usize) -> PrepareFn {
        let model = self.0.clone();
        Box::new(move || {
            let p = model
                .prepare_here(&input, max_new_tokens)
                .map_err(|e| RowError::Invalid(e.to_string()))?;
            Ok(Prepared {
                prompt_tokens: p.len,
                embeds: p.embeds,
                adapter: p.adapter,
                audio_branch: (!input.audios.is_empty()).then_some(p.audio_branch),
            })
        })
    }
}
