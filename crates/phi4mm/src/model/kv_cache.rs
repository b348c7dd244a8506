//! Per-sequence decoder state: the KV cache of every layer and the row's RoPE state. One per
//! batch row; nothing is shared between rows.

use super::rope::{RopeMode, RopeState};

/// Keys and values of one layer, `[len, kv_heads · head_dim]` each, appended per step.
#[derive(Default, Clone)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// Growth of a cache buffer when it is full: an eighth of its length (at least 64 KiB), not
/// `Vec`'s doubling. At the real model's 256 KiB per position a 32k-token row holds 8 GiB of
/// keys and values; doubling could leave almost as much again allocated and unused.
const GROW_MIN: usize = 16 * 1024;

fn grow_for(buf: &mut Vec<f32>, extra: usize) {
    let need = buf.len() + extra;
    if need > buf.capacity() {
        let target = need.max(buf.len() + (buf.len() / 8).max(GROW_MIN));
        buf.reserve_exact(target - buf.len());
    }
}

/// The most bytes the keys and values of a row of `positions` positions can hold allocated on
/// the host backend: every layer's `num_kv_heads · head_dim` floats per position, with the slack
/// of a buffer's growth. (The KV pool's charge for such a row, and the settings check's.)
pub fn row_bytes(text: &crate::checkpoint::config::TextConfig, positions: usize) -> usize {
    let floats = positions * text.num_kv_heads * text.head_dim;
    let allocated = floats + floats / 8 + GROW_MIN;
    2 * text.num_layers * allocated * std::mem::size_of::<f32>()
}

impl LayerKv {
    /// Appends new positions' keys and values (the same number of each).
    pub fn append(&mut self, k: &[f32], v: &[f32]) {
        debug_assert_eq!(k.len(), v.len());
        grow_for(&mut self.k, k.len());
        grow_for(&mut self.v, v.len());
        self.k.extend_from_slice(k);
        self.v.extend_from_slice(v);
    }

    /// Bytes allocated for this layer's keys and values.
    pub fn allocated_bytes(&self) -> usize {
        (self.k.capacity() + self.v.capacity()) * std::mem::size_of::<f32>()
    }
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

    /// Bytes the KV cache holds allocated, over all layers.
    pub fn kv_allocated_bytes(&self) -> usize {
        self.layers.iter().map(LayerKv::allocated_bytes).sum()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_over_allocation_stays_within_an_eighth() {
        // One decode position at a time, as the real model appends: 1024 floats per position.
        let mut kv = LayerKv::default();
        let row = vec![0.5f32; 1024];
        for _ in 0..4000 {
            kv.append(&row, &row);
            let len = kv.k.len();
            assert!(kv.k.capacity() <= len + (len / 8).max(GROW_MIN) + row.len());
        }
        assert_eq!(kv.k.len(), 4000 * 1024);
        assert!(kv.allocated_bytes() <= 2 * 4 * (4000 * 1024 * 9 / 8 + GROW_MIN));
    }
}
