//! SigLIP-NaViT vision tower, 2×2 pooling, the HD layout with learned separators (`hd`), and
//! the image projection.

mod hd;
mod input;

pub use hd::{HdLayout, HdRow, ImageShapeError};
pub use input::ImageInput;

use rayon::prelude::*;

use crate::checkpoint::schema::VISION_PREFIX;
use crate::checkpoint::{Checkpoint, TensorView, VisionConfig};

use super::encoder_layers::{Linear, Norm};
use crate::kernels::matmul::sgemm;
use crate::kernels::ops::{add_in_place, gelu_erf, gelu_tanh_in_place, layer_norm, softmax};

struct SiglipLayer {
    ln1: Norm,
    ln2: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    fc1: Linear,
    fc2: Linear,
}

pub struct VisionEncoder {
    pub config: VisionConfig,
    patch: Linear,
    position: TensorView,
    layers: Vec<SiglipLayer>,
    hd: HdLayout,
    proj_up: Linear,
    proj_down: Linear,
    text_hidden: usize,
}

/// Output of the tower for one image.
pub struct ImageEncoding {
    /// Feature-layer output per crop, `[crops, grid², hidden]` (before pooling).
    pub features: Vec<f32>,
    /// Projected rows for the decoder, `[tokens, text_hidden]`.
    pub embeds: Vec<f32>,
    pub tokens: usize,
}

/// NaViT position id of every patch of a crop (0 for masked patches).
pub(crate) fn position_ids(c: &VisionConfig, mask: &[u8]) -> Vec<usize> {
    let grid = c.grid();
    let nh = (0..grid).filter(|&r| mask[r * grid] != 0).count();
    let nw = (0..grid).filter(|&c| mask[c] != 0).count();
    // Boundaries j/grid, j = 1..grid-1, compared with the fractional coordinate i·(1/n) in
    // float32 (the reference's arange + bucketize, right=True).
    let bucket = |i: usize, n: usize| -> usize {
        let x = (i as f64 * (1.0 / n as f64)) as f32;
        (1..grid).filter(|&j| j as f32 / grid as f32 <= x).count()
    };
    let mut ids = vec![0; grid * grid];
    for r in 0..nh {
        for cc in 0..nw {
            if mask[r * grid + cc] != 0 {
                ids[r * grid + cc] = bucket(r, nh) * grid + bucket(cc, nw);
            }
        }
    }
    ids
}

impl VisionEncoder {
    pub fn load(ck: &Checkpoint) -> Self {
        let c = ck.config.vision.clone();
        let ip = format!("{VISION_PREFIX}img_processor.");
        let layers = (0..c.layers_used())
            .map(|i| {
                let p = format!("{ip}encoder.layers.{i}.");
                SiglipLayer {
                    ln1: Norm::load(ck, &format!("{p}layer_norm1")),
                    ln2: Norm::load(ck, &format!("{p}layer_norm2")),
                    q: Linear::load(ck, &format!("{p}self_attn.q_proj")),
                    k: Linear::load(ck, &format!("{p}self_attn.k_proj")),
                    v: Linear::load(ck, &format!("{p}self_attn.v_proj")),
                    out: Linear::load(ck, &format!("{p}self_attn.out_proj")),
                    fc1: Linear::load(ck, &format!("{p}mlp.fc1")),
                    fc2: Linear::load(ck, &format!("{p}mlp.fc2")),
                }
            })
            .collect();
        VisionEncoder {
            patch: Linear::load(ck, &format!("{ip}embeddings.patch_embedding")),
            position: ck
                .tensor(&format!("{ip}embeddings.position_embedding.weight"))
                .clone(),
            layers,
            hd: HdLayout::load(ck),
            proj_up: Linear::load(ck, &format!("{VISION_PREFIX}img_projection_up")),
            proj_down: Linear::load(ck, &format!("{VISION_PREFIX}img_projection_down")),
            text_hidden: ck.config.text.hidden_size,
            config: c,
        }
    }

    /// The HD layout rule (and the separators) the tower's rows are placed by.
    pub fn hd(&self) -> &HdLayout {
        &self.hd
    }

    /// Number of decoder rows an image with these crop masks produces (273 + Uh·(Uw+1) for the
    /// official sizes).
    pub fn token_count(&self, image: &ImageInput) -> usize {
        self.hd.token_count(image)
    }

    /// Whether the image's crops, pixels and masks fit its canvas.
    pub fn check(&self, image: &ImageInput) -> Result<(), ImageShapeError> {
        self.hd.check(image)
    }

    /// Runs the tower on every crop and builds the projected image rows.
    pub fn encode(&self, image: &ImageInput) -> ImageEncoding {
        let c = &self.config;
        let grid = c.grid();
        let np = grid * grid;
        let hid = c.hidden_size;
        if let Err(e) = self.hd.check(image) {
            panic!("image shape (checked at admission): {e}");
        }
        let crop_len = c.num_channels * c.image_size * c.image_size;

        let features: Vec<Vec<f32>> = (0..image.crops)
            .map(|k| {
                self.encode_crop(
                    &image.pixel_values[k * crop_len..(k + 1) * crop_len],
                    &image.patch_masks[k * np..(k + 1) * np],
                )
            })
            .collect();

        // 2×2 average pooling per crop → [g, g, hid].
        let g = grid / 2;
        let pooled: Vec<Vec<f32>> = features
            .iter()
            .map(|f| {
                let mut p = vec![0.0; g * g * hid];
                for r in 0..g {
                    for cc in 0..g {
                        let dst = &mut p[(r * g + cc) * hid..(r * g + cc + 1) * hid];
                        for (dr, dc) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                            let src = ((2 * r + dr) * grid + 2 * cc + dc) * hid;
                            add_in_place(dst, &f[src..src + hid]);
                        }
                        for v in dst.iter_mut() {
                            *v /= 4.0;
                        }
                    }
                }
                p
            })
            .collect();

        let rows = self.hd.assemble(image, &pooled);
        let tokens = rows.len() / hid;
        let up = self.proj_up.forward(&rows, tokens);
        let act: Vec<f32> = up.par_iter().map(|&v| gelu_erf(v)).collect();
        let embeds = self.proj_down.forward(&act, tokens);
        debug_assert_eq!(embeds.len(), tokens * self.text_hidden);
        ImageEncoding {
            features: features.concat(),
            embeds,
            tokens,
        }
    }

    /// Feature-layer output of one crop, `[grid², hidden]`.
    fn encode_crop(&self, pixels: &[f32], mask: &[u8]) -> Vec<f32> {
        let c = &self.config;
        let (grid, ps, ch, hid) = (c.grid(), c.patch_size, c.num_channels, c.hidden_size);
        let np = grid * grid;
        let size = c.image_size;
        // Patches flattened as (channel, ky, kx), matching the conv weight layout.
        let plen = ch * ps * ps;
        let mut patches = vec![0.0; np * plen];
        for pr in 0..grid {
            for pc in 0..grid {
                let dst = &mut patches[(pr * grid + pc) * plen..(pr * grid + pc + 1) * plen];
                let mut i = 0;
                for cc in 0..ch {
                    for ky in 0..ps {
                        let row = (cc * size + pr * ps + ky) * size + pc * ps;
                        dst[i..i + ps].copy_from_slice(&pixels[row..row + ps]);
                        i += ps;
                    }
                }
            }
        }
        let mut x = self.patch.forward(&patches, np);
        let pos = self.position.data();
        let mut prow = vec![0.0; hid];
        for (p, id) in position_ids(c, mask).into_iter().enumerate() {
            pos.widen_into(id * hid, &mut prow);
            add_in_place(&mut x[p * hid..(p + 1) * hid], &prow);
        }
        let key_valid: Vec<bool> = mask.iter().map(|&m| m != 0).collect();

        for layer in &self.layers {
            let h = layer_norm(&x, &layer.ln1.w, &layer.ln1.b, c.layer_norm_eps);
            let attn = self.attention(layer, &h, &key_valid);
            let o = layer.out.forward(&attn, np);
            add_in_place(&mut x, &o);
            let h = layer_norm(&x, &layer.ln2.w, &layer.ln2.b, c.layer_norm_eps);
            let mut f = layer.fc1.forward(&h, np);
            gelu_tanh_in_place(&mut f);
            let o = layer.fc2.forward(&f, np);
            add_in_place(&mut x, &o);
        }
        x
    }

    /// Bidirectional multi-head attention; masked patches are excluded as keys.
    fn attention(&self, layer: &SiglipLayer, h: &[f32], key_valid: &[bool]) -> Vec<f32> {
        let c = &self.config;
        let n = key_valid.len();
        let hid = c.hidden_size;
        let nh = c.num_heads;
        let hd = hid / nh;
        let q = layer.q.forward(h, n);
        let k = layer.k.forward(h, n);
        let v = layer.v.forward(h, n);
        let scale = (hd as f32).powf(-0.5);
        let heads: Vec<Vec<f32>> = (0..nh)
            .into_par_iter()
            // One scores buffer per worker (4 MiB for a crop), reused across heads: a fresh one
            // per head is faulted in and zeroed each time, which `sgemm` then overwrites.
            .map_init(Vec::new, |s, hh| {
                s.resize(n * n, 0.0);
                sgemm(n, hd, n, &q[hh * hd..], hid, 1, &k[hh * hd..], 1, hid, s, n);
                for row in s.chunks_mut(n) {
                    for (sv, &ok) in row.iter_mut().zip(key_valid) {
                        *sv = if ok { *sv * scale } else { f32::NEG_INFINITY };
                    }
                    softmax(row);
                }
                let mut o = vec![0.0; n * hd];
                sgemm(n, n, hd, s, n, 1, &v[hh * hd..], hid, 1, &mut o, hd);
                o
            })
            .collect();
        let mut out = vec![0.0; n * hid];
        for (hh, o) in heads.iter().enumerate() {
            for t in 0..n {
                out[t * hid + hh * hd..t * hid + (hh + 1) * hd]
                    .copy_from_slice(&o[t * hd..(t + 1) * hd]);
            }
        }
        out
    }
}
