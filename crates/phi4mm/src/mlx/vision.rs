//! The vision tower on MLX: SigLIP patch embedding, the encoder up to the feature layer, 2×2
//! pooling, the HD layout (the host's rule, [`HdLayout::rows`]) and the projection MLP. All crops
//! of an image run as one batch.

use mlx_rs::ops::{self, erf, matmul, softmax_axis, tanh};
use mlx_rs::{fast, Array};

use crate::checkpoint::schema::VISION_PREFIX;
use crate::checkpoint::VisionConfig;
use crate::model::vision::{position_ids, HdLayout, HdRow};
use crate::model::{ImageEncoding, ImageInput};

use super::weights::MlxWeights;
use super::MlxError;

/// A biased linear layer: `x · wᵀ + b`, weight kept transposed for the matmul.
struct Linear {
    wt: Array,
    b: Array,
}

impl Linear {
    fn load(w: &MlxWeights, prefix: &str) -> Result<Self, MlxError> {
        let weight = w.f32(&format!("{prefix}.weight"))?;
        let out = weight.shape()[0];
        // Conv weights [out, ch, k, k] flatten to [out, ch·k·k] in the patch order below.
        let wt = weight.reshape(&[out, -1])?.transpose()?;
        Ok(Linear {
            wt,
            b: w.f32(&format!("{prefix}.bias"))?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array, MlxError> {
        Ok(ops::add(matmul(x, &self.wt)?, &self.b)?)
    }
}

struct Norm {
    w: Array,
    b: Array,
}

impl Norm {
    fn load(w: &MlxWeights, prefix: &str) -> Result<Self, MlxError> {
        Ok(Norm {
            w: w.f32(&format!("{prefix}.weight"))?,
            b: w.f32(&format!("{prefix}.bias"))?,
        })
    }

    fn forward(&self, x: &Array, eps: f32) -> Result<Array, MlxError> {
        Ok(fast::layer_norm(x, &self.w, &self.b, eps)?)
    }
}

struct Layer {
    ln1: Norm,
    ln2: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    fc1: Linear,
    fc2: Linear,
}

pub struct MlxVision {
    config: VisionConfig,
    patch: Linear,
    position: Array,
    layers: Vec<Layer>,
    /// `[sub separator; global separator]`, `[2, hidden]`.
    separators: Array,
    proj_up: Linear,
    proj_down: Linear,
}

impl MlxVision {
    pub fn load(w: &MlxWeights, config: &VisionConfig) -> Result<Self, MlxError> {
        let ip = format!("{VISION_PREFIX}img_processor.");
        let layers = (0..config.layers_used())
            .map(|i| {
                let p = format!("{ip}encoder.layers.{i}.");
                Ok(Layer {
                    ln1: Norm::load(w, &format!("{p}layer_norm1"))?,
                    ln2: Norm::load(w, &format!("{p}layer_norm2"))?,
                    q: Linear::load(w, &format!("{p}self_attn.q_proj"))?,
                    k: Linear::load(w, &format!("{p}self_attn.k_proj"))?,
                    v: Linear::load(w, &format!("{p}self_attn.v_proj"))?,
                    out: Linear::load(w, &format!("{p}self_attn.out_proj"))?,
                    fc1: Linear::load(w, &format!("{p}mlp.fc1"))?,
                    fc2: Linear::load(w, &format!("{p}mlp.fc2"))?,
                })
            })
            .collect::<Result<_, MlxError>>()?;
        let sep = |name: &str| -> Result<Array, MlxError> {
            Ok(w.f32(&format!("{VISION_PREFIX}{name}"))?
                .reshape(&[1, config.hidden_size as i32])?)
        };
        let separators = ops::concatenate(
            &[
                sep("sub_img_feature_extensor")?,
                sep("global_img_feature_extensor")?,
            ],
            0,
        )?;
        Ok(MlxVision {
            config: config.clone(),
            patch: Linear::load(w, &format!("{ip}embeddings.patch_embedding"))?,
            position: w.f32(&format!("{ip}embeddings.position_embedding.weight"))?,
            layers,
            separators,
            proj_up: Linear::load(w, &format!("{VISION_PREFIX}img_projection_up"))?,
            proj_down: Linear::load(w, &format!("{VISION_PREFIX}img_projection_down"))?,
        })
    }

    /// The tower on every crop of `image` and its projected rows; `hd` is the host's layout (shape
    /// checks, row order and counts are the host's).
    pub fn encode(&self, hd: &HdLayout, image: &ImageInput) -> Result<ImageEncoding, MlxError> {
        let c = &self.config;
        hd.check(image)
            .map_err(|e| MlxError::Start(format!("image shape: {e}")))?;
        let (grid, ps, ch, hid) = (
            c.grid() as i32,
            c.patch_size as i32,
            c.num_channels as i32,
            c.hidden_size as i32,
        );
        let crops = image.crops as i32;
        let np = grid * grid;

        // Patches flattened as (channel, ky, kx), the conv weight's layout.
        let pixels = Array::from_slice(&image.pixel_values, &[crops, ch, grid, ps, grid, ps]);
        let patches =
            pixels
                .transpose_axes(&[0, 2, 4, 1, 3, 5])?
                .reshape(&[crops, np, ch * ps * ps])?;
        let mut x = self.patch.forward(&patches)?;

        // NaViT positions and the key mask, per crop.
        let npu = np as usize;
        let mut pos = Vec::with_capacity(image.crops * npu);
        let mut key_bias = Vec::with_capacity(image.crops * npu);
        for k in 0..image.crops {
            let mask = &image.patch_masks[k * npu..(k + 1) * npu];
            pos.extend(position_ids(c, mask).into_iter().map(|i| i as u32));
            key_bias.extend(
                mask.iter()
                    .map(|&m| if m != 0 { 0.0f32 } else { f32::NEG_INFINITY }),
            );
        }
        let pos = Array::from_slice(&pos, &[crops * np]);
        let pos = self
            .position
            .take_axis(&pos, 0)?
            .reshape(&[crops, np, hid])?;
        x = ops::add(&x, &pos)?;
        let key_bias = Array::from_slice(&key_bias, &[crops, 1, 1, np]);

        for layer in &self.layers {
            let h = layer.ln1.forward(&x, c.layer_norm_eps)?;
            let a = self.attention(layer, &h, &key_bias)?;
            x = ops::add(&x, layer.out.forward(&a)?)?;
            let h = layer.ln2.forward(&x, c.layer_norm_eps)?;
            let f = gelu_tanh(&layer.fc1.forward(&h)?)?;
            x = ops::add(&x, layer.fc2.forward(&f)?)?;
        }
        let features = x;

        // 2×2 average pooling per crop, then the HD layout as a gather over
        // [every crop's pooled rows; sub separator; global separator].
        let g = grid / 2;
        let pooled = features
            .reshape(&[crops, g, 2, g, 2, hid])?
            .mean_axes(&[2, 4], false)?
            .reshape(&[crops * g * g, hid])?;
        let table = ops::concatenate(&[pooled, self.separators.clone()], 0)?;
        let per_crop = (g * g) as usize;
        let sep_at = image.crops * per_crop;
        let order: Vec<u32> = hd
            .rows(image)
            .into_iter()
            .map(|row| match row {
                HdRow::Pooled { crop, index } => (crop * per_crop + index) as u32,
                HdRow::SubSeparator => sep_at as u32,
                HdRow::GlobalSeparator => sep_at as u32 + 1,
            })
            .collect();
        let tokens = order.len();
        let rows = table.take_axis(Array::from_slice(&order, &[tokens as i32]), 0)?;
        let up = self.proj_up.forward(&rows)?;
        let embeds = self.proj_down.forward(&gelu_erf(&up)?)?;

        Ok(ImageEncoding {
            features: to_vec(&features)?,
            embeds: to_vec(&embeds)?,
            tokens,
        })
    }

    /// Bidirectional multi-head attention over each crop; masked patches are excluded as keys.
    fn attention(&self, layer: &Layer, h: &Array, key_bias: &Array) -> Result<Array, MlxError> {
        let c = &self.config;
        let shape = h.shape();
        let (b, n) = (shape[0], shape[1]);
        let nh = c.num_heads as i32;
        let hd = c.hidden_size as i32 / nh;
        let heads = |a: Array| -> Result<Array, MlxError> {
            Ok(a.reshape(&[b, n, nh, hd])?.transpose_axes(&[0, 2, 1, 3])?)
        };
        let q = heads(layer.q.forward(h)?)?;
        let k = heads(layer.k.forward(h)?)?;
        let v = heads(layer.v.forward(h)?)?;
        let scale = Array::from_f32((hd as f32).powf(-0.5));
        let scores = ops::add(
            ops::multiply(matmul(&q, k.transpose_axes(&[0, 1, 3, 2])?)?, &scale)?,
            key_bias,
        )?;
        let p = softmax_axis(&scores, -1, true)?;
        // A crop with every patch masked has no key: its rows are NaN here and zero on the host
        // (whose softmax gives all-zero rows), so they are zeroed the same way.
        let p = ops::select(p.is_nan()?, Array::from_f32(0.0), &p)?;
        Ok(matmul(&p, &v)?
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[b, n, nh * hd])?)
    }
}

/// GELU, tanh approximation (the SigLIP MLP), as the host computes it.
fn gelu_tanh(x: &Array) -> Result<Array, MlxError> {
    let c = Array::from_f32(0.797_884_6);
    let cubic = ops::multiply(Array::from_f32(0.044715), x.multiply(x)?.multiply(x)?)?;
    let t = tanh(ops::multiply(&c, ops::add(x, &cubic)?)?)?;
    Ok(ops::multiply(
        ops::multiply(Array::from_f32(0.5), x)?,
        ops::add(Array::from_f32(1.0), &t)?,
    )?)
}

/// GELU, exact erf form (the projection MLP).
fn gelu_erf(x: &Array) -> Result<Array, MlxError> {
    let e = erf(ops::multiply(
        x,
        Array::from_f32(std::f32::consts::FRAC_1_SQRT_2),
    )?)?;
    Ok(ops::multiply(
        ops::multiply(Array::from_f32(0.5), x)?,
        ops::add(Array::from_f32(1.0), &e)?,
    )?)
}

/// Evaluates `a` and copies it out, row-major f32.
pub(super) fn to_vec(a: &Array) -> Result<Vec<f32>, MlxError> {
    let a = a.as_type::<f32>()?;
    a.eval()?;
    Ok(a.try_as_slice::<f32>()
        .map_err(|e| MlxError::Start(format!("reading an MLX result: {e}")))?
        .to_vec())
}
