//! Per-sequence decoder state: the KV cache of every layer, the position, and the RoPE mode the
//! cache was built with. One per batch row; nothing is shared between rows.

use super::rope::RopeMode;

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
    pub(crate) len: usize,
    pub(crate) mode: RopeMode,
    /// Input embeddings of every cached position while the cache uses the short RoPE factors:
    /// when the sequence first grows past `original_max_position_embeddings`, the reference
    /// re-encodes it from scratch with the long factors, which needs these. Dropped once long.
    pub(crate) history: Vec<f32>,
}

impl SequenceState {
    pub(crate) fn new(num_layers: usize) -> Self {
        SequenceState {
            layers: vec![LayerKv::default(); num_layers],
            len: 0,
            mode: RopeMode::Short,
            history: Vec::new(),
        }
    }

    /// Number of positions in the cache (= position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn rope_mode(&self) -> RopeMode {
        self.mode
    }

    /// Forget everything (slot reuse).
    pub fn clear(&mut self) {
        for l in &mut self.layers {
            l.k.clear();
            l.v.clear();
        }
        self.len = 0;
        self.mode = RopeMode::Short;
        self.history.clear();
    }
}
