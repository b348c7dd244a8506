//! The decoder's self-attention: fused qkv projection, partial rotary embedding, causal
//! grouped-query attention of each row against its own KV cache, and the output projection.
//! Projections run once over the tokens of every row; the attention itself runs per row.

use rayon::prelude::*;

use crate::adapter::AdapterMode;
use crate::checkpoint::{Checkpoint, TextConfig};
use crate::kernels::matmul::sgemm;
use crate::kernels::ops::softmax;

use super::kv_cache::LayerKv;
use super::lora::LoraLinear;
use super::rope::{Rope, RopeTable};

/// Query rows per attention block: bounds the `[block, len]` score matrix for long prompts.
const ATTN_QUERY_BLOCK: usize = 256;

/// One row's new tokens in a step: `tokens` consecutive tokens of the batch from position
/// `pos0`, rotated by `rotation` (the row's positions under its factor set).
pub(super) struct RowSpan {
    pub tokens: usize,
    pub pos0: usize,
    pub rotation: RopeTable,
}

/// Which of a row's new tokens a step needs the attention output of. Every token's keys and
/// values reach the cache either way.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Queries {
    Every,
    /// Only each row's last token: what the last layer computes, since only the last token
    /// feeds the LM head.
    LastOfRow,
}

impl Queries {
    fn of(self, tokens: usize) -> usize {
        match self {
            Queries::Every => tokens,
            Queries::LastOfRow => 1,
        }
    }
}

pub(super) struct Attention {
    qkv: LoraLinear,
    o: LoraLinear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    pub fn load(ck: &Checkpoint, layer: usize, c: &TextConfig) -> Self {
        Attention {
            qkv: LoraLinear::load(ck, layer, "self_attn.qkv_proj"),
            o: LoraLinear::load(ck, layer, "self_attn.o_proj"),
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// `o(attention(qkv(x)))` for the normed hidden states `x` of every row's new tokens,
    /// `[tokens, hidden]`; appends each row's new keys and values to its cache (`caches[r]`).
    /// Returns the outputs of the tokens `queries` names, whose adapters are `out_adapters`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        x: &[f32],
        adapters: &[AdapterMode],
        out_adapters: &[AdapterMode],
        rows: &[RowSpan],
        caches: &mut [&mut LayerKv],
        rope: &Rope,
        queries: Queries,
    ) -> Vec<f32> {
        let qkv = self.qkv.forward(x, adapters);
        let width = (self.heads + 2 * self.kv_heads) * self.head_dim;
        let mut out = Vec::with_capacity(out_adapters.len() * self.heads * self.head_dim);
        let mut t0 = 0;
        for (row, kv) in rows.iter().zip(caches.iter_mut()) {
            let row_qkv = &qkv[t0 * width..(t0 + row.tokens) * width];
            out.extend(self.attend_row(row_qkv, row, kv, rope, queries.of(row.tokens)));
            t0 += row.tokens;
        }
        self.o.forward(&out, out_adapters)
    }

    /// Causal attention of one row's new tokens (`qkv`, `[n, (heads + 2·kv_heads)·head_dim]`)
    /// against its cache, which this appends to; returns the outputs of the last `queries` of
    /// them, `[queries, heads·head_dim]`.
    fn attend_row(
        &self,
        qkv: &[f32],
        row: &RowSpan,
        kv: &mut LayerKv,
        rope: &Rope,
        queries: usize,
    ) -> Vec<f32> {
        let (nh, nkv, hd) = (self.heads, self.kv_heads, self.head_dim);
        let n = row.tokens;
        // The first query's position; the tokens before it only add keys and values.
        let skipped = n - queries;
        let pos0 = row.pos0 + skipped;
        let qw = nh * hd;
        let kw = nkv * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let group = nh / nkv;

        let mut q = Vec::with_capacity(n * qw);
        let mut k = Vec::with_capacity(n * kw);
        let mut v = Vec::with_capacity(n * kw);
        for r in qkv.chunks(qw + 2 * kw) {
            q.extend_from_slice(&r[..qw]);
            k.extend_from_slice(&r[qw..qw + kw]);
            v.extend_from_slice(&r[qw + kw..]);
        }
        rope.rotate(&mut q, nh, &row.rotation);
        rope.rotate(&mut k, nkv, &row.rotation);
        kv.append(&k, &v);
        let (kc, vc) = (&kv.k, &kv.v);
        let q = &q[skipped * qw..];
        let n = queries;

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
        let mut out = vec![0.0; n * qw];
        for (hh, o) in head_outs.iter().enumerate() {
            for t in 0..n {
                out[t * qw + hh * hd..t * qw + (hh + 1) * hd]
                    .copy_from_slice(&o[t * hd..(t + 1) * hd]);
            }
        }
        out
    }
}
