//! The Phi3-style text decoder, stepped over a batch of independent rows.
//!
//! One [`Decoder::step`] takes any mix of rows — a prefill of many tokens, a single decode token,
//! a re-encode — each with its own [`SequenceState`] (position, KV cache, RoPE mode) and its own
//! [`AdapterMode`]. The linear layers run once over all tokens of all rows (weights read once);
//! attention runs per row against that row's cache. A solo request is a batch of one.

use rayon::prelude::*;

use crate::checkpoint::{Checkpoint, TensorView, TextConfig};
use crate::step::StepRow;

use super::kv_cache::SequenceState;
use super::linear::{linear_new, sgemm, Matrix};
use super::lora::LoraLinear;
use super::ops::{add_in_place, rms_norm, silu, softmax};
use super::rope::{Rope, RopePlan};

struct DecoderLayer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    qkv: LoraLinear,
    o: LoraLinear,
    gate_up: LoraLinear,
    down: LoraLinear,
}

pub struct Decoder {
    pub config: TextConfig,
    embed: TensorView,
    lm_head: TensorView,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
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

/// Query rows per attention block: bounds the `[block, len]` score matrix for long prompts.
const ATTN_QUERY_BLOCK: usize = 256;

impl Decoder {
    pub fn load(ck: &Checkpoint) -> Self {
        let c = ck.config.text.clone();
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}.");
                DecoderLayer {
                    input_norm: ck
                        .tensor(&format!("{p}input_layernorm.weight"))
                        .to_f32_vec(),
                    post_norm: ck
                        .tensor(&format!("{p}post_attention_layernorm.weight"))
                        .to_f32_vec(),
                    qkv: LoraLinear::load(ck, i, "self_attn.qkv_proj"),
                    o: LoraLinear::load(ck, i, "self_attn.o_proj"),
                    gate_up: LoraLinear::load(ck, i, "mlp.gate_up_proj"),
                    down: LoraLinear::load(ck, i, "mlp.down_proj"),
                }
            })
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
            norm: ck.tensor("model.norm.weight").to_f32_vec(),
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
        let c = &self.config;
        let h = c.hidden_size;

        // Per row: the factor set, and a re-encode the first time it crosses the original context.
        let mut inputs: Vec<Vec<f32>> = Vec::with_capacity(rows.len());
        for row in rows.iter_mut() {
            let n = row.tokens(h);
            let plan = row.state.rope.plan(&self.rope, row.embeds, n);
            if let RopePlan::Reencode(_) = plan {
                row.state.clear_cache();
            }
            inputs.push(plan.embeds().to_vec());
        }

        let counts: Vec<usize> = inputs.iter().map(|e| e.len() / h).collect();
        let total: usize = counts.iter().sum();
        let mut token_modes = Vec::with_capacity(total);
        for (row, &n) in rows.iter().zip(&counts) {
            token_modes.extend(std::iter::repeat_n(row.adapter, n));
        }
        let mut x = inputs.concat();

        for (li, layer) in self.layers.iter().enumerate() {
            let normed = rms_norm(&x, &layer.input_norm, c.rms_norm_eps);
            let qkv = layer.qkv.forward(&normed, &token_modes);
            let attn = self.attention(li, &qkv, rows, &counts);
            let o = layer.o.forward(&attn, &token_modes);
            add_in_place(&mut x, &o);

            let normed = rms_norm(&x, &layer.post_norm, c.rms_norm_eps);
            let gu = layer.gate_up.forward(&normed, &token_modes);
            let inter = c.intermediate_size;
            let mut act = vec![0.0; total * inter];
            for (a, g) in act.chunks_mut(inter).zip(gu.chunks(2 * inter)) {
                let (gate, up) = g.split_at(inter);
                for ((o, gv), uv) in a.iter_mut().zip(gate).zip(up) {
                    *o = uv * silu(*gv);
                }
            }
            let d = layer.down.forward(&act, &token_modes);
            add_in_place(&mut x, &d);
        }

        for (row, &n) in rows.iter_mut().zip(&counts) {
            row.state.rope.len += n;
        }

        // Only each row's last token feeds the head.
        let mut last = Vec::with_capacity(rows.len() * h);
        let mut end = 0;
        for &n in &counts {
            end += n;
            last.extend_from_slice(&x[(end - 1) * h..end * h]);
        }
        rms_norm(&last, &self.norm, c.rms_norm_eps)
    }

    /// LM head over final-normed hidden states `[rows, hidden]`.
    pub fn logits(&self, hidden: &[f32]) -> Vec<Vec<f32>> {
        let h = self.config.hidden_size;
        let rows = hidden.len() / h;
        let v = self.config.vocab_size;
        let all = linear_new(hidden, rows, Matrix::of(&self.lm_head), None);
        all.chunks(v).map(<[f32]>::to_vec).collect()
    }

    /// Causal GQA attention of each row's new tokens against its cache (which this appends to).
    fn attention(
        &self,
        layer: usize,
        qkv: &[f32],
        rows: &mut [StepRow<SequenceState>],
        counts: &[usize],
    ) -> Vec<f32> {
        let c = &self.config;
        let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let qw = nh * hd;
        let kw = nkv * hd;
        let width = qw + 2 * kw;
        let total: usize = counts.iter().sum();
        let mut out = vec![0.0; total * qw];
        let scale = 1.0 / (hd as f32).sqrt();
        let group = nh / nkv;

        let mut t0 = 0;
        for (row, &n) in rows.iter_mut().zip(counts) {
            let st = &mut *row.state;
            let pos0 = st.rope.len;
            let mut q = Vec::with_capacity(n * qw);
            let mut k = Vec::with_capacity(n * kw);
            let mut v = Vec::with_capacity(n * kw);
            for t in 0..n {
                let r = &qkv[(t0 + t) * width..(t0 + t + 1) * width];
                q.extend_from_slice(&r[..qw]);
                k.extend_from_slice(&r[qw..qw + kw]);
                v.extend_from_slice(&r[qw + kw..]);
            }
            self.rope.apply(&mut q, nh, pos0, st.rope.mode);
            self.rope.apply(&mut k, nkv, pos0, st.rope.mode);
            let kv = &mut st.layers[layer];
            kv.k.extend_from_slice(&k);
            kv.v.extend_from_slice(&v);
            let len = pos0 + n;
            let (kc, vc) = (&kv.k, &kv.v);

            // Heads in parallel; each writes its own column slice of the row's output.
            let head_outs: Vec<Vec<f32>> = (0..nh)
                .into_par_iter()
                .map(|hh| {
                    let g = hh / group;
                    let mut o = vec![0.0; n * hd];
                    let mut scores = Vec::new();
                    let mut b0 = 0;
                    while b0 < n {
                        let bn = ATTN_QUERY_BLOCK.min(n - b0);
                        // Keys visible to the last query of this block.
                        let kl = pos0 + b0 + bn;
                        scores.resize(bn * kl, 0.0);
                        sgemm(
                            bn,
                            hd,
                            kl,
                            &q[b0 * qw + hh * hd..],
                            qw,
                            1,
                            &kc[g * hd..],
                            1,
                            kw,
                            &mut scores,
                            kl,
                        );
                        for i in 0..bn {
                            let visible = pos0 + b0 + i + 1;
                            let s = &mut scores[i * kl..(i + 1) * kl];
                            for v in s[..visible].iter_mut() {
                                *v *= scale;
                            }
                            s[visible..].fill(f32::NEG_INFINITY);
                            softmax(s);
                        }
                        sgemm(
                            bn,
                            kl,
                            hd,
                            &scores,
                            kl,
                            1,
                            &vc[g * hd..],
                            kw,
                            1,
                            &mut o[b0 * hd..],
                            hd,
                        );
                        b0 += bn;
                    }
                    o
                })
                .collect();
            debug_assert_eq!(len, pos0 + n);
            for (hh, o) in head_outs.iter().enumerate() {
                for t in 0..n {
                    out[(t0 + t) * qw + hh * hd..(t0 + t) * qw + (hh + 1) * hd]
                        .copy_from_slice(&o[t * hd..(t + 1) * hd]);
                }
            }
            t0 += n;
        }
        out
    }
}
