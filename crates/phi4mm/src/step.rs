//! The decoder as every backend offers it: one batched step over independent rows. The host model
//! and the IREE backend implement [`StepBackend`]; the scheduler and [`greedy`] drive any of them
//! without knowing which.

use crate::adapter::AdapterMode;
use crate::sampling::argmax;

/// One row of a batched step: the row's own decoder state, its new input embeddings and its
/// adapter.
pub struct StepRow<'a, S> {
    pub state: &'a mut S,
    /// `[n, hidden]`, n ≥ 1.
    pub embeds: &'a [f32],
    pub adapter: AdapterMode,
}

impl<S> StepRow<'_, S> {
    /// Number of new tokens in the row (panics on a shape that is not `[n ≥ 1, hidden]`).
    pub fn tokens(&self, hidden: usize) -> usize {
        assert!(
            !self.embeds.is_empty() && self.embeds.len().is_multiple_of(hidden),
            "row embeddings shape"
        );
        self.embeds.len() / hidden
    }
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

    /// The most KV-cache memory, in bytes, one row of `positions` positions (prompt + generated
    /// tokens) can come to on this backend: what admission reserves from the KV pool.
    fn kv_bytes(&self, positions: usize) -> usize;

    /// The prompt tokens a row's prefill costs the same for in one step as fewer would: a
    /// backend that runs prefill in fixed-size calls pads a partial one. The scheduler cuts a
    /// row's share of a step's prefill budget to a multiple of it, unless the share ends the
    /// prompt.
    fn prefill_granularity(&self) -> usize {
        1
    }
}

/// What greedy decoding of one prompt produced.
#[derive(Clone, Debug)]
pub struct GreedyOutput {
    pub tokens: Vec<u32>,
    /// Logits at the last prompt position.
    pub logits_first: Vec<f32>,
}

/// Greedy decoding of one prompt on any backend (a batch of one): prefill, then one token per
/// step until `max_new_tokens` or a stop id (`stop_ids` empty: never stop early).
pub fn greedy<B: StepBackend>(
    backend: &B,
    embeds: &[f32],
    adapter: AdapterMode,
    max_new_tokens: usize,
    stop_ids: &[u32],
) -> GreedyOutput {
    let mut state = backend.new_state();
    let mut step = |e: &[f32]| {
        backend
            .step(&mut [StepRow {
                state: &mut state,
                embeds: e,
                adapter,
            }])
            .remove(0)
    };
    let mut logits = step(embeds);
    let logits_first = logits.clone();
    let mut tokens = Vec::new();
    while tokens.len() < max_new_tokens {
        let next = argmax(&logits);
        tokens.push(next);
        if stop_ids.contains(&next) || tokens.len() == max_new_tokens {
            break;
        }
        logits = step(&backend.embed(&[next]));
    }
    GreedyOutput {
        tokens,
        logits_first,
    }
}
