//! Per-sequence decoder state: the KV cache of every layer and the row's RoPE state. One per
//! batch row; nothing is shared between rows.

use super::rope::{RopeMode, RopeState};

/// Keys and values of one layer, `[len, kv_heads · head_dim]` each, appended per step.
#[derive(Default, Clone)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// Everything the decoder keeps for one sequence between steps.
#[derive(Clone)]
pub struct SequenceState {
    pub(crate) layers: Vec<LayerKv>,
    pub(crate) rope: RopeState,
}

impl SequenceState {
    pub(crate) fn new(num_layers: usize) -> Self {
        SequenceState {
            layers: vec![LayerKv::default(); num_layers],
            rope: RopeState::default(),
        }
    }

    /// Number of positions in the cache (= position of the next token).
    pub fn len(&self) -> usize {
        self.rope.len
    }

    pub fn is_empty(&self) -> bool {
        self.rope.len == 0
    }

    pub fn rope_mode(&self) -> RopeMode {
        self.rope.mode
    }

    /// Empties every layer's keys and values (the positions stay with the RoPE state).
    pub(crate) fn clear_cache(&mut self) {
        for l in &mut self.layers {
            l.k.clear();
            l.v.clear();
        }
    }

    /// Forget everything (slot reuse).
    pub fn clear(&mut self) {
        self.clear_cache();
        self.rope = RopeState::default();
    }
}
