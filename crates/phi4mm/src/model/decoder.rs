//! The Phi3-style text decoder, stepped over a batch of independent rows and written as the math
//! (after candle's `phi3`): each `DecoderLayer` is `x += attn(norm(x)); x += mlp(norm(x))`.
//!
//! One [`Decoder::step`] takes any mix of rows — a prefill of many tokens, a single decode token,
//! a re-encode — each with its own [`SequenceState`] (position, KV cache, RoPE mode) and its own
//! [`AdapterMode`]. The linear layers run once over all tokens of all rows (weights read once);
//! attention runs per row against that row's cache. A solo request is a batch of one.

use crate::adapter::AdapterMode;
use crate::checkpoint::{Checkpoint, TensorView, TextConfig};
use crate::kernels::linear::{linear_new, Matrix};
use crate::kernels::ops::{add_in_place, rms_norm, silu_gated};
use crate::step::StepRow;
use rayon::prelude::*;

use super::attention::{Attention, Queries, RowSpan};
use super::kv_cache::{LayerKv, SequenceState};
use super::lora::LoraLinear;
use super::rope::{Rope, RopePlan};

/// RMSNorm with its learned scale.
struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    fn load(ck: &Checkpoint, name: &str, eps: f32) -> Self {
        RmsNorm {
            weight: ck.tensor(name).to_f32_vec(),
            eps,
        }
    }

    fn forward(&self, x: &[f32]) -> Vec<f32> {
        rms_norm(x, &self.weight, self.eps)
    }
}

/// The gated MLP, `down(up ⊙ silu(gate))`, with gate and up from one fused projection.
struct Mlp {
    gate_up: LoraLinear,
    down: LoraLinear,
    intermediate: usize,
}

impl Mlp {
    fn forward(&self, x: &[f32], adapters: &[AdapterMode]) -> Vec<f32> {
        let inter = self.intermediate;
        let gate_up = self.gate_up.forward(x, adapters);
        let mut act = vec![0.0; adapters.len() * inter];
        // Rows in parallel: a prefill's activations are an exponential each.
        act.par_chunks_mut(inter)
            .zip(gate_up.par_chunks(2 * inter))
            .for_each(|(a, g)| {
                let (gate, up) = g.split_at(inter);
                silu_gated(gate, up, a);
            });
        self.down.forward(&act, adapters)
    }
}

struct DecoderLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    fn load(ck: &Checkpoint, i: usize, c: &TextConfig) -> Self {
        let p = format!("model.layers.{i}.");
        DecoderLayer {
            input_norm: RmsNorm::load(ck, &format!("{p}input_layernorm.weight"), c.rms_norm_eps),
            attn: Attention::load(ck, i, c),
            post_norm: RmsNorm::load(
                ck,
                &format!("{p}post_attention_layernorm.weight"),
                c.rms_norm_eps,
            ),
            mlp: Mlp {
                gate_up: LoraLinear::load(ck, i, "mlp.gate_up_proj"),
                down: LoraLinear::load(ck, i, "mlp.down_proj"),
                intermediate: c.intermediate_size,
            },
        }
    }

    /// `x` is `[tokens, hidden]` over every row's new tokens; `caches[r]` is row `r`'s KV cache
    /// of this layer. With [`Queries::LastOfRow`], every token still adds its keys and values,
    /// and `x` leaves as `[rows, hidden]`: each row's last token only.
    fn forward(
        &self,
        x: &mut Vec<f32>,
        batch: &Batch,
        caches: &mut [&mut LayerKv],
        rope: &Rope,
        queries: Queries,
    ) {
        let h = self.input_norm.forward(x);
        let out_adapters = match queries {
            Queries::Every => &batch.adapters,
            Queries::LastOfRow => &batch.last_adapters,
        };
        let a = self.attn.forward(
            &h,
            &batch.adapters,
            out_adapters,
            &batch.rows,
            caches,
            rope,
            queries,
        );
        if queries == Queries::LastOfRow {
            *x = batch.last_tokens(x);
        }
        add_in_place(x, &a);
        let h = self.post_norm.forward(x);
        let m = self.mlp.forward(&h, out_adapters);
        add_in_place(x, &m);
    }
}

/// The tokens of one step: each token's adapter (its row's), each row's span, and the adapter of
/// each row's last token.
struct Batch {
    adapters: Vec<AdapterMode>,
    last_adapters: Vec<AdapterMode>,
    rows: Vec<RowSpan>,
    hidden: usize,
}

impl Batch {
    /// Each row's last token of `x`, `[tokens, hidden]` → `[rows, hidden]`.
    fn last_tokens(&self, x: &[f32]) -> Vec<f32> {
        let h = self.hidden;
        let mut last = Vec::with_capacity(self.rows.len() * h);
        let mut end = 0;
        for span in &self.rows {
            end += span.tokens;
            last.extend_from_slice(&x[(end - 1) * h..end * h]);
        }
        last
    }
}

pub struct Decoder {
    pub config: TextConfig,
    embed: TensorView,
    lm_head: TensorView,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    rope: Rope,
}

/// Rows of the embedding table `[vocab, hidden]` for `ids`, widened to f32 (every backend embeds
/// on the host).
pub fn embed_tokens(table: &TensorView, c: &TextConfig, ids: &[u32]) -> Vec<f32> {
    let h = c.hidden_size;
    let data = table.data();
    let mut out = vec![0.0; ids.len() * h];
    for (row, &id) in out.chunks_mut(h).zip(ids) {
        assert!(
            (id as usize) < c.vocab_size,
            "token id {id} outside the vocabulary"
        );
        data.widen_into(id as usize * h, row);
    }
    out
}

impl Decoder {
    pub fn load(ck: &Checkpoint) -> Self {
        let c = ck.config.text.clone();
        let layers = (0..c.num_layers)
            .map(|i| DecoderLayer::load(ck, i, &c))
            .collect();
        let embed = ck.tensor("model.embed_tokens.weight").clone();
        let lm_head = if c.tie_word_embeddings {
            embed.clone()
        } else {
            ck.tensor("lm_head.weight").clone()
        };
        Decoder {
            rope: Rope::new(&c),
            embed,
            lm_head,
            layers,
            norm: RmsNorm::load(ck, "model.norm.weight", c.rms_norm_eps),
            config: c,
        }
    }

    pub fn new_sequence(&self) -> SequenceState {
        SequenceState::new(self.config.num_layers)
    }

    /// Token embeddings `[ids.len(), hidden]`.
    pub fn embed(&self, ids: &[u32]) -> Vec<f32> {
        embed_tokens(&self.embed, &self.config, ids)
    }

    /// Runs the new tokens of every row through the decoder, appending to each row's cache, and
    /// returns the logits of each row's last new token (`[vocab]` per row).
    pub fn step(&self, rows: &mut [StepRow<SequenceState>]) -> Vec<Vec<f32>> {
        let hidden = self.step_hidden(rows);
        self.logits(&hidden)
    }

    /// As [`Decoder::step`] but returns the final-normed hidden state of each row's last token.
    pub fn step_hidden(&self, rows: &mut [StepRow<SequenceState>]) -> Vec<f32> {
        let h = self.config.hidden_size;
        let mut x = Vec::new();
        let mut batch = Batch {
            adapters: Vec::new(),
            last_adapters: Vec::with_capacity(rows.len()),
            rows: Vec::with_capacity(rows.len()),
            hidden: h,
        };
        for row in rows.iter_mut() {
            let n = row.tokens(h);
            let st = &mut *row.state;
            let plan = st.rope.plan(&self.rope, row.embeds, n);
            if let RopePlan::Reencode(_) = plan {
                st.clear_cache();
            }
            let embeds = plan.embeds();
            let tokens = embeds.len() / h;
            x.extend_from_slice(embeds);
            batch
                .adapters
                .extend(std::iter::repeat_n(row.adapter, tokens));
            batch.last_adapters.push(row.adapter);
            batch.rows.push(RowSpan {
                tokens,
                pos0: st.rope.len,
                rotation: self.rope.table(st.rope.len, tokens, st.rope.mode),
            });
        }

        // Only each row's last token feeds the head, so the last layer computes the rest of the
        // tokens' keys and values and nothing more: a prefill skips most of one layer's work.
        let last_layer = self.layers.len().saturating_sub(1);
        for (li, layer) in self.layers.iter().enumerate() {
            let mut caches: Vec<&mut LayerKv> =
                rows.iter_mut().map(|r| &mut r.state.layers[li]).collect();
            let queries = if li == last_layer {
                Queries::LastOfRow
            } else {
                Queries::Every
            };
            layer.forward(&mut x, &batch, &mut caches, &self.rope, queries);
        }
        for (row, span) in rows.iter_mut().zip(&batch.rows) {
            row.state.rope.len += span.tokens;
        }
        if self.layers.is_empty() {
            x = batch.last_tokens(&x);
        }
        self.norm.forward(&x)
    }

    /// LM head over final-normed hidden states `[rows, hidden]`.
    pub fn logits(&self, hidden: &[f32]) -> Vec<Vec<f32>> {
        let h = self.config.hidden_size;
        let rows = hidden.len() / h;
        let v = self.config.vocab_size;
        let all = linear_new(hidden, rows, Matrix::of(&self.lm_head), None);
        if rows == 1 {
            // The usual decode step: hand over the buffer instead of copying 200k logits.
            return vec![all];
        }
        all.chunks(v).map(<[f32]>::to_vec).collect()
    }
}
