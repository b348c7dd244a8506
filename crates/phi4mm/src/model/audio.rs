//! Audio encoder ("cascades" Conformer): mean/var normalisation, NeMo dw-striding subsampling,
//! 500-frame windows, Conformer blocks with T5 relative bias, and the two audio projections.

use rayon::prelude::*;

use crate::adapter::AudioBranch;
use crate::checkpoint::schema::AUDIO_PREFIX;
use crate::checkpoint::{AudioConfig, Checkpoint};

use super::encoder_layers::{Linear, Norm};
use crate::kernels::matmul::sgemm;
use crate::kernels::ops::{
    add_in_place, add_scaled, gelu_erf, layer_norm, silu, silu_gated, softmax,
};

const LN_EPS: f32 = 1e-5;

/// The Conformer's LayerNorms all use the same epsilon.
impl Norm {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        layer_norm(x, &self.w, &self.b, LN_EPS)
    }
}

struct FeedForward {
    norm: Norm,
    up: Linear,
    down: Linear,
}

struct ConvModule {
    norm: Norm,
    glu_pw: Linear,
    b1: Vec<f32>,
    b2: Vec<f32>,
    dw_w: Vec<f32>,
    dw_b: Vec<f32>,
    pw: Linear,
    ext_pw: Linear,
}

struct Block {
    ff_in: FeedForward,
    ff_out: FeedForward,
    ln_att: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    conv: ConvModule,
    ln_out: Norm,
}

/// A depthwise 3×3 conv (or the first 1-in-channel conv) of the subsampler.
struct Conv3x3 {
    w: Vec<f32>,
    b: Vec<f32>,
}

pub struct AudioEncoder {
    pub config: AudioConfig,
    mean: Vec<f32>,
    invstd: Vec<f32>,
    conv0: Conv3x3,
    /// (depthwise, pointwise) per later stride-2 stage.
    stages: Vec<(Conv3x3, Linear)>,
    embed_out: Linear,
    bias_values: Vec<f32>,
    blocks: Vec<Block>,
    proj_speech: (Linear, Linear),
    proj_vision: (Linear, Linear),
}

/// Encoder output and projected rows for one clip.
pub struct AudioEncoding {
    /// Conformer output `[frames', audio_hidden]`.
    pub encoder_out: Vec<f32>,
    /// Projected rows `[frames', text_hidden]`.
    pub embeds: Vec<f32>,
    pub tokens: usize,
}

impl AudioEncoder {
    pub fn load(ck: &Checkpoint) -> Self {
        let c = ck.config.audio.clone();
        let ep = format!("{AUDIO_PREFIX}encoder.");
        let conv = |i: usize| Conv3x3 {
            w: ck
                .tensor(&format!("{ep}embed.conv.{i}.weight"))
                .to_f32_vec(),
            b: ck.tensor(&format!("{ep}embed.conv.{i}.bias")).to_f32_vec(),
        };
        let stages = (1..c.subsampling_stages())
            .map(|s| {
                (
                    conv(3 * s - 1),
                    Linear::load(ck, &format!("{ep}embed.conv.{}", 3 * s)),
                )
            })
            .collect();
        let blocks = (0..c.num_blocks)
            .map(|i| {
                let p = format!("{ep}encoders.{i}.");
                let ff = |name: &str| FeedForward {
                    norm: Norm::load(ck, &format!("{p}{name}.layer_norm")),
                    up: Linear::load(ck, &format!("{p}{name}.gate_up_proj")),
                    down: Linear::load(ck, &format!("{p}{name}.down_proj")),
                };
                Block {
                    ff_in: ff("feed_forward_in"),
                    ff_out: ff("feed_forward_out"),
                    ln_att: Norm::load(ck, &format!("{p}layer_norm_att")),
                    q: Linear::load(ck, &format!("{p}self_attn.q_proj")),
                    k: Linear::load(ck, &format!("{p}self_attn.k_proj")),
                    v: Linear::load(ck, &format!("{p}self_attn.v_proj")),
                    o: Linear::load(ck, &format!("{p}self_attn.o_proj")),
                    conv: ConvModule {
                        norm: Norm::load(ck, &format!("{p}conv.layer_norm")),
                        glu_pw: Linear::load(ck, &format!("{p}conv.glu.ext_pw_conv_1d")),
                        b1: ck.tensor(&format!("{p}conv.glu.b1")).to_f32_vec(),
                        b2: ck.tensor(&format!("{p}conv.glu.b2")).to_f32_vec(),
                        dw_w: ck
                            .tensor(&format!("{p}conv.dw_sep_conv_1d.dw_conv.weight"))
                            .to_f32_vec(),
                        dw_b: ck
                            .tensor(&format!("{p}conv.dw_sep_conv_1d.dw_conv.bias"))
                            .to_f32_vec(),
                        pw: Linear::load(ck, &format!("{p}conv.dw_sep_conv_1d.pw_conv")),
                        ext_pw: Linear::load(ck, &format!("{p}conv.ext_pw_conv_1d")),
                    },
                    ln_out: Norm::load(ck, &format!("{p}layer_norm")),
                }
            })
            .collect();
        let proj = |branch: &str| {
            (
                Linear::load(ck, &format!("{AUDIO_PREFIX}up_proj_for_{branch}")),
                Linear::load(ck, &format!("{AUDIO_PREFIX}down_proj_for_{branch}")),
            )
        };
        AudioEncoder {
            mean: ck
                .tensor(&format!("{ep}encoder_embedding.global_mean"))
                .to_f32_vec(),
            invstd: ck
                .tensor(&format!("{ep}encoder_embedding.global_invstd"))
                .to_f32_vec(),
            conv0: conv(0),
            stages,
            embed_out: Linear::load(ck, &format!("{ep}embed.out")),
            bias_values: ck
                .tensor(&format!(
                    "{ep}relative_attention_bias_layer.bias_values.weight"
                ))
                .to_f32_vec(),
            blocks,
            proj_speech: proj("speech"),
            proj_vision: proj("vision_speech"),
            config: c,
        }
    }

    /// Decoder rows a clip of `frames` feature frames produces (`ceil(frames / 8)` officially).
    pub fn token_count(&self, frames: usize) -> usize {
        self.config.token_count(frames)
    }

    /// Encodes one clip of log-mel features `[frames, input_size]` and projects it with `branch`.
    pub fn encode(&self, features: &[f32], frames: usize, branch: AudioBranch) -> AudioEncoding {
        let c = &self.config;
        assert_eq!(
            features.len(),
            frames * c.input_size,
            "audio features shape"
        );
        let (x, t) = self.subsample(features, frames);
        let d = c.hidden_size;

        // Long audio: zero-pad to a multiple of the window and run windows independently; the
        // padded frames of a single clip take part in attention (reference behaviour).
        let win = c.max_seq_len_window;
        let (padded, wlen) = if t > win {
            let mut p = x;
            p.resize(t.div_ceil(win) * win * d, 0.0);
            (p, win)
        } else {
            (x, t)
        };
        let windows = padded.len() / (wlen * d);
        let bias = self.relative_bias(wlen);
        let mut out = Vec::with_capacity(padded.len());
        for w in 0..windows {
            let mut xw = padded[w * wlen * d..(w + 1) * wlen * d].to_vec();
            for block in &self.blocks {
                xw = self.block(block, xw, wlen, &bias);
            }
            out.extend_from_slice(&xw);
        }
        out.truncate(t * d);

        let (up, down) = match branch {
            AudioBranch::Speech => &self.proj_speech,
            AudioBranch::Vision => &self.proj_vision,
        };
        let mut h = up.forward(&out, t);
        for v in h.iter_mut() {
            *v = gelu_erf(*v);
        }
        let embeds = down.forward(&h, t);
        AudioEncoding {
            encoder_out: out,
            embeds,
            tokens: t,
        }
    }

    /// Normalisation and the NeMo dw-striding subsampler → `([t', d], t')`.
    fn subsample(&self, features: &[f32], frames: usize) -> (Vec<f32>, usize) {
        let c = &self.config;
        let fin = c.input_size;
        let ch = c.nemo_conv_channels;
        let norm: Vec<f32> = features
            .chunks(fin)
            .flat_map(|r| {
                r.iter()
                    .zip(&self.mean)
                    .zip(&self.invstd)
                    .map(|((v, m), s)| (v - m) * s)
            })
            .collect();

        // Activations are kept channel-last: [time, freq, channel].
        let out_len = |n: usize| (n + 2 - 3) / 2 + 1;
        let (mut t, mut f) = (out_len(frames), out_len(fin));
        // conv.0: 1 → ch channels, 3×3, stride 2, padding 1, then ReLU.
        let mut x = vec![0.0; t * f * ch];
        x.par_chunks_mut(f * ch).enumerate().for_each(|(ot, row)| {
            for of in 0..f {
                let dst = &mut row[of * ch..(of + 1) * ch];
                dst.copy_from_slice(&self.conv0.b);
                for ky in 0..3 {
                    let it = (2 * ot + ky) as isize - 1;
                    if it < 0 || it as usize >= frames {
                        continue;
                    }
                    for kx in 0..3 {
                        let iff = (2 * of + kx) as isize - 1;
                        if iff < 0 || iff as usize >= fin {
                            continue;
                        }
                        let v = norm[it as usize * fin + iff as usize];
                        for (o, dst_v) in dst.iter_mut().enumerate() {
                            *dst_v += self.conv0.w[o * 9 + ky * 3 + kx] * v;
                        }
                    }
                }
                for v in dst.iter_mut() {
                    *v = v.max(0.0);
                }
            }
        });
        for (dw, pw) in &self.stages {
            let (nt, nf) = (out_len(t), out_len(f));
            // Depthwise 3×3, stride 2, padding 1.
            let mut y = vec![0.0; nt * nf * ch];
            y.par_chunks_mut(nf * ch).enumerate().for_each(|(ot, row)| {
                for of in 0..nf {
                    let dst = &mut row[of * ch..(of + 1) * ch];
                    dst.copy_from_slice(&dw.b);
                    for ky in 0..3 {
                        let it = (2 * ot + ky) as isize - 1;
                        if it < 0 || it as usize >= t {
                            continue;
                        }
                        for kx in 0..3 {
                            let iff = (2 * of + kx) as isize - 1;
                            if iff < 0 || iff as usize >= f {
                                continue;
                            }
                            let src = &x[(it as usize * f + iff as usize) * ch..][..ch];
                            for (o, dst_v) in dst.iter_mut().enumerate() {
                                *dst_v += dw.w[o * 9 + ky * 3 + kx] * src[o];
                            }
                        }
                    }
                }
            });
            // Pointwise 1×1 conv = linear over channels, then ReLU.
            let mut z = pw.forward(&y, nt * nf);
            for v in z.iter_mut() {
                *v = v.max(0.0);
            }
            x = z;
            t = nt;
            f = nf;
        }
        // Flatten channel-major (feature index = channel · f + freq), then the output linear.
        let mut flat = vec![0.0; t * ch * f];
        for ti in 0..t {
            for fi in 0..f {
                for ci in 0..ch {
                    flat[ti * ch * f + ci * f + fi] = x[(ti * f + fi) * ch + ci];
                }
            }
        }
        (self.embed_out.forward(&flat, t), t)
    }

    /// T5 relative bias `[heads, len, len]`: `bias_values[clamp(j − i, −D, D−1) + D][h]`.
    fn relative_bias(&self, len: usize) -> Vec<f32> {
        let heads = self.config.num_heads;
        let dmax = self.config.bias_max_distance as isize;
        let mut b = vec![0.0; heads * len * len];
        for h in 0..heads {
            for i in 0..len {
                for j in 0..len {
                    let r = (j as isize - i as isize).clamp(-dmax, dmax - 1) + dmax;
                    b[(h * len + i) * len + j] = self.bias_values[r as usize * heads + h];
                }
            }
        }
        b
    }

    fn feed_forward(&self, ff: &FeedForward, x: &[f32], t: usize) -> Vec<f32> {
        let inter = self.config.intermediate_size;
        let h = ff.norm.apply(x);
        let u = ff.up.forward(&h, t);
        // [value | gate]: the first half is the value (opposite to the text MLP).
        let mut act = vec![0.0; t * inter];
        act.par_chunks_mut(inter)
            .zip(u.par_chunks(2 * inter))
            .for_each(|(a, r)| {
                let (val, gate) = r.split_at(inter);
                silu_gated(gate, val, a);
            });
        ff.down.forward(&act, t)
    }

    fn block(&self, b: &Block, mut x: Vec<f32>, t: usize, bias: &[f32]) -> Vec<f32> {
        let c = &self.config;
        let d = c.hidden_size;
        let ff = self.feed_forward(&b.ff_in, &x, t);
        add_scaled(&mut x, &ff, 0.5);

        // Self-attention, not causal, with the relative bias.
        let h = b.ln_att.apply(&x);
        let (q, k, v) = (b.q.forward(&h, t), b.k.forward(&h, t), b.v.forward(&h, t));
        let nh = c.num_heads;
        let hd = d / nh;
        let scale = (hd as f32).powf(-0.5);
        let heads: Vec<Vec<f32>> = (0..nh)
            .into_par_iter()
            .map(|hh| {
                let mut s = vec![0.0; t * t];
                sgemm(
                    t,
                    hd,
                    t,
                    &q[hh * hd..],
                    d,
                    1,
                    &k[hh * hd..],
                    1,
                    d,
                    &mut s,
                    t,
                );
                let hb = &bias[hh * t * t..(hh + 1) * t * t];
                for (row, brow) in s.chunks_mut(t).zip(hb.chunks(t)) {
                    for (sv, bv) in row.iter_mut().zip(brow) {
                        *sv = *sv * scale + bv;
                    }
                    softmax(row);
                }
                let mut o = vec![0.0; t * hd];
                sgemm(t, t, hd, &s, t, 1, &v[hh * hd..], d, 1, &mut o, hd);
                o
            })
            .collect();
        let mut attn = vec![0.0; t * d];
        for (hh, o) in heads.iter().enumerate() {
            for ti in 0..t {
                attn[ti * d + hh * hd..ti * d + (hh + 1) * hd]
                    .copy_from_slice(&o[ti * hd..(ti + 1) * hd]);
            }
        }
        let o = b.o.forward(&attn, t);
        add_in_place(&mut x, &o);

        let conv = self.conv_module(&b.conv, &x, t);
        add_in_place(&mut x, &conv);

        let ff = self.feed_forward(&b.ff_out, &x, t);
        add_scaled(&mut x, &ff, 0.5);
        b.ln_out.apply(&x)
    }

    fn conv_module(&self, m: &ConvModule, x: &[f32], t: usize) -> Vec<f32> {
        let d = self.config.hidden_size;
        let ks = self.config.kernel_size;
        let h = m.norm.apply(x);
        let g = m.glu_pw.forward(&h, t);
        // GLU: (first half + b1) · swish(second half + b2).
        let mut glu = vec![0.0; t * d];
        for (o, r) in glu.chunks_mut(d).zip(g.chunks(2 * d)) {
            for i in 0..d {
                o[i] = (r[i] + m.b1[i]) * silu(r[d + i] + m.b2[i]);
            }
        }
        // Causal depthwise conv: frame t sees t-(k-1) … t (left zero padding).
        let mut dw = vec![0.0; t * d];
        for ti in 0..t {
            let dst = &mut dw[ti * d..(ti + 1) * d];
            dst.copy_from_slice(&m.dw_b);
            for kk in 0..ks {
                let src_t = ti as isize + kk as isize - (ks as isize - 1);
                if src_t < 0 {
                    continue;
                }
                let src = &glu[src_t as usize * d..(src_t as usize + 1) * d];
                for ci in 0..d {
                    dst[ci] += m.dw_w[ci * ks + kk] * src[ci];
                }
            }
        }
        let mut p = m.pw.forward(&dw, t);
        for v in p.iter_mut() {
            *v = silu(*v);
        }
        m.ext_pw.forward(&p, t)
    }
}
