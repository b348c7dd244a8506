//! Model configuration read from either checkpoint layout. Keys the original remote code
//! hard-codes (SigLIP dims, placeholder ids, the 500-frame audio window) fall back to the official
//! values when a config does not carry them.

use std::path::Path;

use serde_json::Value;

use super::error::{CheckpointError, Result};
use super::layout::LoraAdapter;

/// LongRoPE parameters (partial rotary, two factor sets and the magnitude factor).
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    pub short_factor: Vec<f32>,
    pub long_factor: Vec<f32>,
    /// `sqrt(1 + ln(max/original_max) / ln(original_max))`, 1 when max ≤ original_max.
    pub attention_factor: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub original_max_position_embeddings: usize,
    pub longrope: Option<LongRope>,
    pub tie_word_embeddings: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_channels: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub crop_size: usize,
    pub layer_norm_eps: f32,
    /// Python-style index into the hidden states (-2 = output of the second-to-last layer).
    pub feature_layer: i64,
}

impl VisionConfig {
    /// Patches per crop side (32 for 448/14).
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Number of encoder layers that must run to produce the feature layer.
    pub fn layers_used(&self) -> usize {
        // hidden_states has num_layers + 1 entries (embeddings first).
        let n = self.num_layers as i64 + 1;
        let idx = if self.feature_layer < 0 {
            n + self.feature_layer
        } else {
            self.feature_layer
        };
        idx.clamp(0, self.num_layers as i64) as usize
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct AudioConfig {
    pub input_size: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    pub num_blocks: usize,
    pub nemo_conv_channels: usize,
    pub time_reduction: usize,
    pub kernel_size: usize,
    pub ext_pw_out_channel: usize,
    pub depthwise_separable_out_channel: usize,
    pub bias_max_distance: usize,
    /// Encoder frames per independent attention window (500, hard-coded in the reference).
    pub max_seq_len_window: usize,
    pub compression_rate: usize,
    pub downsample_rate: usize,
}

impl AudioConfig {
    /// Mel width after the subsampler's stride-2 stages (80 → 10 for time_reduction 8).
    pub fn subsampled_freq(&self) -> usize {
        let mut f = self.input_size;
        for _ in 0..self.subsampling_stages() {
            f = f.div_ceil(2);
        }
        f
    }

    pub fn subsampling_stages(&self) -> usize {
        self.time_reduction.trailing_zeros() as usize
    }

    /// Encoder rows a clip of `frames` feature frames produces: each stride-2 stage halves the
    /// length, rounding up (`ceil(frames / 8)` officially).
    pub fn token_count(&self, frames: usize) -> usize {
        let mut t = frames;
        for _ in 0..self.subsampling_stages() {
            t = t.div_ceil(2);
        }
        t
    }
}

/// One LoRA adapter's hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraConfig {
    pub r: usize,
    pub alpha: f32,
}

impl LoraConfig {
    pub fn scale(&self) -> f32 {
        self.alpha / self.r as f32
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub text: TextConfig,
    pub vision: VisionConfig,
    pub audio: AudioConfig,
    pub speech_lora: Option<LoraConfig>,
    pub vision_lora: Option<LoraConfig>,
    pub bos_token_id: u32,
    pub pad_token_id: u32,
    /// Stop ids: the generation config's list, else the config's.
    pub eos_token_ids: Vec<u32>,
    pub image_token_id: u32,
    pub audio_token_id: u32,
}

impl ModelConfig {
    /// The LoRA settings of `adapter`, when the checkpoint has it.
    pub fn lora(&self, adapter: LoraAdapter) -> Option<LoraConfig> {
        match adapter {
            LoraAdapter::Speech => self.speech_lora,
            LoraAdapter::Vision => self.vision_lora,
        }
    }
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|cause| CheckpointError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    serde_json::from_str(&text).map_err(|cause| CheckpointError::Json {
        path: path.to_path_buf(),
        cause,
    })
}

fn invalid(key: &str, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::InvalidConfig {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// Typed access to a JSON object with the key path carried into errors.
struct Obj<'a> {
    value: Option<&'a Value>,
    prefix: String,
}

impl<'a> Obj<'a> {
    fn new(value: Option<&'a Value>, prefix: &str) -> Self {
        Obj {
            value,
            prefix: prefix.to_string(),
        }
    }

    fn key(&self, k: &str) -> String {
        format!("{}{}", self.prefix, k)
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        self.value.and_then(|v| v.get(k)).filter(|v| !v.is_null())
    }

    /// Refuses an activation this implementation does not compute: `k`, when present, must be
    /// `expected` (a different one would be computed as `expected`, silently).
    fn activation(&self, k: &str, expected: &str) -> Result<()> {
        match self.get(k).map(|v| v.as_str()) {
            None => Ok(()),
            Some(Some(act)) if act == expected => Ok(()),
            Some(found) => Err(invalid(
                &self.key(k),
                format!(
                    "{} (only {expected} is supported)",
                    found.map_or("a value that is no string".into(), |f| format!("`{f}`"))
                ),
            )),
        }
    }

    fn child(&self, k: &str) -> Obj<'a> {
        Obj::new(self.get(k), &format!("{}{}.", self.prefix, k))
    }

    fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                invalid(
                    &self.key(k),
                    format!("expected a non-negative integer, got {v}"),
                )
            }),
        }
    }

    fn i64_opt(&self, k: &str) -> Result<Option<i64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| invalid(&self.key(k), format!("expected an integer, got {v}"))),
        }
    }

    fn f64_opt(&self, k: &str) -> Result<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| invalid(&self.key(k), format!("expected a number, got {v}"))),
        }
    }

    fn usize_req(&self, k: &str) -> Result<usize> {
        self.usize_opt(k)?
            .ok_or_else(|| invalid(&self.key(k), "missing"))
    }

    fn usize_or(&self, k: &str, default: usize) -> Result<usize> {
        Ok(self.usize_opt(k)?.unwrap_or(default))
    }

    fn f64_or(&self, k: &str, default: f64) -> Result<f64> {
        Ok(self.f64_opt(k)?.unwrap_or(default))
    }

    fn f32_list(&self, k: &str) -> Result<Option<Vec<f32>>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_f64()
                        .map(|x| x as f32)
                        .ok_or_else(|| invalid(&self.key(k), format!("non-numeric entry {v}")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(invalid(&self.key(k), format!("expected a list, got {v}"))),
        }
    }

    /// An id or a list of ids.
    fn ids(&self, k: &str) -> Result<Option<Vec<u32>>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|x| x as u32)
                        .ok_or_else(|| invalid(&self.key(k), format!("bad id {v}")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => v
                .as_u64()
                .map(|x| Some(vec![x as u32]))
                .ok_or_else(|| invalid(&self.key(k), format!("bad id {v}"))),
        }
    }
}

/// Official values for the keys the original layout does not carry.
pub mod defaults {
    pub const IMAGE_TOKEN_ID: u32 = 200010;
    pub const AUDIO_TOKEN_ID: u32 = 200011;
    pub const EOS_TOKEN_IDS: [u32; 2] = [200020, 199999];
    pub const AUDIO_WINDOW: usize = 500;
}

/// Which layout a checkpoint directory uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Remote-code layout: `base_layer` + inline `lora_{A,B}.{speech,vision}`, original config keys.
    Original,
    /// transformers-native layout: renamed tensors, PEFT adapter folders.
    Transformers,
}

/// Parses `config.json` (+ `generation_config.json` and adapter configs) of either layout.
pub fn parse_config(dir: &Path, root: &Value, layout: Layout) -> Result<ModelConfig> {
    let top = Obj::new(Some(root), "");
    let text = parse_text(&top)?;

    let (vision, audio, speech_lora, vision_lora, image_token_id, audio_token_id) = match layout {
        Layout::Transformers => {
            let v = top.child("vision_config");
            let a = top.child("audio_config");
            let vision = parse_vision(&v, v.usize_opt("crop_size")?)?;
            audio_activations(&a)?;
            a.activation("nemo_activation", "relu")?;
            let audio = AudioConfig {
                input_size: a.usize_or("input_size", 80)?,
                hidden_size: a.usize_or("hidden_size", 1024)?,
                num_heads: a.usize_or("num_attention_heads", 16)?,
                intermediate_size: a.usize_or("intermediate_size", 1536)?,
                num_blocks: a.usize_or("num_blocks", 24)?,
                nemo_conv_channels: a.usize_or("nemo_conv_channels", 1024)?,
                time_reduction: a.usize_or("time_reduction", 8)?,
                kernel_size: a.usize_or("kernel_size", 3)?,
                ext_pw_out_channel: a.usize_or("ext_pw_out_channel", 1024)?,
                depthwise_separable_out_channel: match a
                    .usize_opt("depthwise_separable_out_channel")?
                {
                    Some(x) => x,
                    None => a.usize_or("depthwise_seperable_out_channel", 1024)?,
                },
                bias_max_distance: a.usize_req("bias_max_distance")?,
                max_seq_len_window: defaults::AUDIO_WINDOW,
                compression_rate: 8,
                downsample_rate: a.usize_or("downsample_rate", 1)?,
            };
            let speech = read_adapter_config(&dir.join("speech-lora"))?;
            let vis = read_adapter_config(&dir.join("vision-lora"))?;
            let image_id = v
                .usize_opt("image_token_id")?
                .map(|x| x as u32)
                .unwrap_or(defaults::IMAGE_TOKEN_ID);
            let audio_id = a
                .usize_opt("audio_token_id")?
                .map(|x| x as u32)
                .unwrap_or(defaults::AUDIO_TOKEN_ID);
            (vision, audio, speech, vis, image_id, audio_id)
        }
        Layout::Original => {
            let v = top.child("vision_config");
            let crop = top
                .child("embd_layer")
                .child("image_embd_layer")
                .usize_opt("crop_size")?;
            let vision = parse_vision(&v, crop)?;
            let ap = top.child("audio_processor").child("config");
            audio_activations(&ap)?;
            let ael = top.child("embd_layer").child("audio_embd_layer");
            let audio = AudioConfig {
                input_size: ap.usize_or("input_size", 80)?,
                hidden_size: ap.usize_or("attention_dim", 1024)?,
                num_heads: ap.usize_or("attention_heads", 16)?,
                intermediate_size: ap.usize_or("linear_units", 1536)?,
                num_blocks: ap.usize_or("num_blocks", 24)?,
                nemo_conv_channels: ap
                    .child("nemo_conv_settings")
                    .usize_or("conv_channels", 1024)?,
                time_reduction: ap.usize_or("time_reduction", 8)?,
                kernel_size: ap.usize_or("kernel_size", 3)?,
                ext_pw_out_channel: ap.usize_or("ext_pw_out_channel", 1024)?,
                depthwise_separable_out_channel: ap
                    .usize_or("depthwise_seperable_out_channel", 1024)?,
                bias_max_distance: ap
                    .child("relative_attention_bias_args")
                    .usize_or("t5_bias_max_distance", 500)?,
                max_seq_len_window: defaults::AUDIO_WINDOW,
                compression_rate: ael.usize_or("compression_rate", 8)?,
                downsample_rate: ael.usize_or("downsample_rate", 1)?,
            };
            let lora = |name: &str| -> Result<Option<LoraConfig>> {
                let o = top.child(name);
                if o.value.is_none() {
                    return Ok(None);
                }
                Ok(Some(LoraConfig {
                    r: o.usize_req("r")?,
                    alpha: o
                        .f64_opt("lora_alpha")?
                        .ok_or_else(|| invalid(&o.key("lora_alpha"), "missing"))?
                        as f32,
                }))
            };
            let image_id = top
                .usize_opt("image_token_id")?
                .map(|x| x as u32)
                .unwrap_or(defaults::IMAGE_TOKEN_ID);
            let audio_id = top
                .usize_opt("audio_token_id")?
                .map(|x| x as u32)
                .unwrap_or(defaults::AUDIO_TOKEN_ID);
            (
                vision,
                audio,
                lora("speech_lora")?,
                lora("vision_lora")?,
                image_id,
                audio_id,
            )
        }
    };

    let bos = top.usize_opt("bos_token_id")?.unwrap_or(199999) as u32;
    let pad = top.usize_opt("pad_token_id")?.unwrap_or(bos as usize) as u32;
    let gen_path = dir.join("generation_config.json");
    let mut eos = None;
    if super::present(&gen_path)? {
        let gen = read_json(&gen_path)?;
        eos = Obj::new(Some(&gen), "generation_config.").ids("eos_token_id")?;
    }
    let eos = match eos {
        Some(e) => e,
        None => top
            .ids("eos_token_id")?
            .unwrap_or(defaults::EOS_TOKEN_IDS.to_vec()),
    };

    let config = ModelConfig {
        text,
        vision,
        audio,
        speech_lora,
        vision_lora,
        bos_token_id: bos,
        pad_token_id: pad,
        eos_token_ids: eos,
        image_token_id,
        audio_token_id,
    };
    check_architecture(&config)?;
    Ok(config)
}

fn parse_text(top: &Obj) -> Result<TextConfig> {
    let hidden = top.usize_req("hidden_size")?;
    let heads = top.usize_req("num_attention_heads")?;
    let kv = top.usize_opt("num_key_value_heads")?.unwrap_or(heads);
    if heads == 0 || hidden % heads != 0 {
        return Err(invalid(
            "num_attention_heads",
            format!("{heads} does not divide hidden_size {hidden}"),
        ));
    }
    if kv == 0 || heads % kv != 0 {
        return Err(invalid(
            "num_key_value_heads",
            format!("{kv} does not divide num_attention_heads {heads}"),
        ));
    }
    let head_dim = hidden / heads;
    // transformers 5 keeps RoPE in `rope_parameters`; 4.x and the original use `rope_scaling`.
    let rp = top.child("rope_parameters");
    let rs = if rp.value.is_some() {
        rp
    } else {
        top.child("rope_scaling")
    };
    let partial = match rs.f64_opt("partial_rotary_factor")? {
        Some(p) => p,
        None => top.f64_or("partial_rotary_factor", 1.0)?,
    };
    let rotary_dim = (head_dim as f64 * partial) as usize;
    if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
        return Err(invalid(
            "partial_rotary_factor",
            format!("gives rotary dim {rotary_dim} for head dim {head_dim}"),
        ));
    }
    let theta = match rs.f64_opt("rope_theta")? {
        Some(t) => t,
        None => top.f64_or("rope_theta", 10000.0)?,
    };
    if !(theta.is_finite() && theta > 0.0) {
        return Err(invalid("rope_theta", "must be finite and > 0"));
    }
    let max_pos = top.usize_or("max_position_embeddings", 131072)?;
    let orig_max = match top.usize_opt("original_max_position_embeddings")? {
        Some(x) => x,
        None => rs.usize_or("original_max_position_embeddings", max_pos)?,
    };
    let kind = rs
        .get("rope_type")
        .or_else(|| rs.get("type"))
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let longrope = match kind.as_deref() {
        None | Some("default") => None,
        // "su" and "yarn" are older spellings the reference reads as longrope.
        Some("longrope") | Some("su") | Some("yarn") => {
            let short = rs
                .f32_list("short_factor")?
                .ok_or_else(|| invalid(&rs.key("short_factor"), "missing"))?;
            let long = rs
                .f32_list("long_factor")?
                .ok_or_else(|| invalid(&rs.key("long_factor"), "missing"))?;
            for (k, f) in [("short_factor", &short), ("long_factor", &long)] {
                if f.len() != rotary_dim / 2 {
                    return Err(invalid(
                        &rs.key(k),
                        format!(
                            "has {} entries, rotary dim {rotary_dim} needs {}",
                            f.len(),
                            rotary_dim / 2
                        ),
                    ));
                }
                if f.iter().any(|x| !x.is_finite() || *x <= 0.0) {
                    return Err(invalid(&rs.key(k), "entries must be finite and positive"));
                }
            }
            let scale = max_pos as f64 / orig_max as f64;
            let attention_factor = match rs.f64_opt("attention_factor")? {
                Some(a) => a,
                None if scale <= 1.0 => 1.0,
                None => (1.0 + scale.ln() / (orig_max as f64).ln()).sqrt(),
            };
            if !(attention_factor.is_finite() && attention_factor > 0.0) {
                return Err(invalid(
                    &rs.key("attention_factor"),
                    "must be finite and > 0",
                ));
            }
            Some(LongRope {
                short_factor: short,
                long_factor: long,
                attention_factor,
            })
        }
        Some(other) => {
            return Err(invalid(
                &rs.key("type"),
                format!("unsupported rope type `{other}`"),
            ))
        }
    };
    if let Some(act) = top.get("hidden_act").and_then(|v| v.as_str()) {
        if act != "silu" {
            return Err(invalid(
                "hidden_act",
                format!("`{act}` (only silu is supported)"),
            ));
        }
    }
    Ok(TextConfig {
        vocab_size: top.usize_req("vocab_size")?,
        hidden_size: hidden,
        intermediate_size: top.usize_req("intermediate_size")?,
        num_layers: top.usize_req("num_hidden_layers")?,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim,
        rotary_dim,
        rms_norm_eps: top.f64_or("rms_norm_eps", 1e-5)? as f32,
        rope_theta: theta,
        max_position_embeddings: max_pos,
        original_max_position_embeddings: orig_max,
        longrope,
        tie_word_embeddings: top
            .get("tie_word_embeddings")
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
    })
}

/// The Conformer's activations, as both layouts name them (swish everywhere).
fn audio_activations(a: &Obj) -> Result<()> {
    for key in ["activation", "conv_activation", "conv_glu_type"] {
        a.activation(key, "swish")?;
    }
    Ok(())
}

fn parse_vision(v: &Obj, crop_size: Option<usize>) -> Result<VisionConfig> {
    v.activation("hidden_act", "gelu_pytorch_tanh")?;
    // Defaults: SigLIP-so400m-patch14-448, hard-coded by the original remote code.
    let image_size = v.usize_or("image_size", 448)?;
    Ok(VisionConfig {
        hidden_size: v.usize_or("hidden_size", 1152)?,
        intermediate_size: v.usize_or("intermediate_size", 4304)?,
        num_layers: v.usize_or("num_hidden_layers", 27)?,
        num_heads: v.usize_or("num_attention_heads", 16)?,
        num_channels: v.usize_or("num_channels", 3)?,
        image_size,
        patch_size: v.usize_or("patch_size", 14)?,
        crop_size: crop_size
            .or(v.usize_opt("crop_size")?)
            .unwrap_or(image_size),
        layer_norm_eps: v.f64_or("layer_norm_eps", 1e-6)? as f32,
        feature_layer: v.i64_opt("feature_layer")?.unwrap_or(-2),
    })
}

fn read_adapter_config(dir: &Path) -> Result<Option<LoraConfig>> {
    let path = dir.join("adapter_config.json");
    if !super::present(&path)? {
        return Ok(None);
    }
    let v = read_json(&path)?;
    let o = Obj::new(Some(&v), &format!("{}:", path.display()));
    Ok(Some(LoraConfig {
        r: o.usize_req("r")?,
        alpha: o
            .f64_opt("lora_alpha")?
            .ok_or_else(|| invalid(&o.key("lora_alpha"), "missing"))? as f32,
    }))
}

/// Architecture numbers that must hold before any tensor is looked at.
fn check_architecture(c: &ModelConfig) -> Result<()> {
    let t = &c.text;
    for (key, v) in [
        ("vocab_size", t.vocab_size),
        ("hidden_size", t.hidden_size),
        ("intermediate_size", t.intermediate_size),
        ("num_hidden_layers", t.num_layers),
    ] {
        if v == 0 {
            return Err(invalid(key, "must be > 0"));
        }
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(t.rms_norm_eps as f64) {
        return Err(invalid("rms_norm_eps", "must be finite and > 0"));
    }
    if !positive(c.vision.layer_norm_eps as f64) {
        return Err(invalid(
            "vision_config.layer_norm_eps",
            "must be finite and > 0",
        ));
    }
    if t.original_max_position_embeddings == 0
        || t.original_max_position_embeddings > t.max_position_embeddings
    {
        return Err(invalid(
            "original_max_position_embeddings",
            "must be in 1..=max_position_embeddings",
        ));
    }
    for (key, id) in [
        ("image_token_id", c.image_token_id),
        ("audio_token_id", c.audio_token_id),
        ("bos_token_id", c.bos_token_id),
        ("pad_token_id", c.pad_token_id),
    ] {
        if id as usize >= t.vocab_size {
            return Err(invalid(
                key,
                format!("{id} is outside the vocabulary ({})", t.vocab_size),
            ));
        }
    }
    let v = &c.vision;
    if v.num_heads == 0 || !v.hidden_size.is_multiple_of(v.num_heads) {
        return Err(invalid(
            "vision_config.num_attention_heads",
            "must divide hidden_size",
        ));
    }
    if v.patch_size == 0
        || !v.image_size.is_multiple_of(v.patch_size)
        || !v.grid().is_multiple_of(2)
    {
        return Err(invalid(
            "vision_config.patch_size",
            "image_size / patch_size must be an even integer",
        ));
    }
    if v.crop_size != v.image_size {
        return Err(invalid(
            "crop_size",
            format!(
                "{} differs from vision image_size {}",
                v.crop_size, v.image_size
            ),
        ));
    }
    let a = &c.audio;
    if a.num_heads == 0 || !a.hidden_size.is_multiple_of(a.num_heads) {
        return Err(invalid(
            "audio num_attention_heads",
            "must divide the audio hidden size",
        ));
    }
    if !a.time_reduction.is_power_of_two() || a.time_reduction < 2 {
        return Err(invalid(
            "audio time_reduction",
            "must be a power of two ≥ 2",
        ));
    }
    if a.ext_pw_out_channel != a.hidden_size || a.depthwise_separable_out_channel != a.hidden_size {
        return Err(invalid(
            "audio ext_pw_out_channel / depthwise_separable_out_channel",
            "must equal the audio hidden size (the reference creates no extra linear otherwise supported here)",
        ));
    }
    if a.kernel_size == 0 || a.bias_max_distance == 0 {
        return Err(invalid(
            "audio kernel_size / bias_max_distance",
            "must be > 0",
        ));
    }
    if a.compression_rate != a.time_reduction || a.downsample_rate != 1 {
        return Err(invalid(
            "audio compression_rate / downsample_rate",
            "only compression_rate == time_reduction and downsample_rate 1 are supported",
        ));
    }
    for (name, l) in [
        ("speech_lora", c.speech_lora),
        ("vision_lora", c.vision_lora),
    ] {
        if let Some(l) = l {
            if l.r == 0 {
                return Err(invalid(&format!("{name}.r"), "must be > 0"));
            }
            if !(l.alpha.is_finite() && l.alpha > 0.0) {
                return Err(invalid(
                    &format!("{name}.lora_alpha"),
                    "must be finite and > 0",
                ));
            }
        }
    }
    Ok(())
}
