//! `phi4mm bench-checkpoint`: random bf16 checkpoints in the transformers layout, complete and
//! loadable, for the benchmarks: the model issue's benchmark config (default) or the real
//! Phi-4-multimodal dimensions (`--preset phi4mm`).

use std::path::{Path, PathBuf};

use std::io::{BufWriter, Write};

use anyhow::Result;
use clap::{Args, ValueEnum};
use rayon::prelude::*;
use serde_json::json;
use switchyard_phi4mm::checkpoint::schema::expected_schema;
use switchyard_phi4mm::checkpoint::{config, Layout};

#[derive(Args)]
pub struct BenchCheckpointArgs {
    /// Output directory: created, or an empty one. A folder with files in it is refused unless
    /// `--force`, for the random weights would replace a checkpoint's files there.
    #[arg(long)]
    out: PathBuf,
    /// Write into `--out` even when it holds files, replacing those of the same names.
    #[arg(long)]
    force: bool,
    /// Seed of the weight generator.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Which dimensions: the benchmark config (590 MB) or the real Phi-4-multimodal (11 GB).
    #[arg(long, value_enum, default_value = "bench")]
    preset: Preset,
    /// Give the checkpoint a real-dimension SigLIP tower (hidden 1152, MLP 4304, 16 heads) with
    /// this many layers (the feature layer is the second to last, so one fewer runs), for
    /// `bench-vision`: the real tower's per-layer cost without its 27 layers' run time. Default:
    /// the preset's tower.
    #[arg(long)]
    vision_layers: Option<usize>,
    /// Give the checkpoint a real-dimension Conformer audio encoder (hidden 1024, feed-forward
    /// 1536, 16 heads, 1024 subsampling channels, relative bias over 500 positions) with this many
    /// blocks, for `bench-batch`'s encoder figures: the real encoder's per-block cost without its
    /// 24 blocks' run time. Default: the preset's encoder.
    #[arg(long)]
    audio_blocks: Option<usize>,
    /// Cut the preset's text decoder to this many layers, each of the preset's dimensions, for
    /// `bench-batch`'s decoder figures: with `--preset phi4mm`, the released decoder's per-layer
    /// cost without its 32 layers' compile and run time. Default: the preset's decoder.
    #[arg(long)]
    text_layers: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// The model issue's benchmark config: text hidden 1024, 8 layers, LoRA r 32 / 24.
    Bench,
    /// The released Phi-4-multimodal-instruct's dimensions (5.6 B parameters), LoRA r 320 / 256.
    Phi4mm,
}

impl Preset {
    fn config(self) -> serde_json::Value {
        match self {
            Preset::Bench => bench_config(),
            Preset::Phi4mm => phi4mm_config(),
        }
    }

    /// (speech r, vision r); alpha = 2r in both, as in the release.
    fn lora_ranks(self) -> [(&'static str, usize); 2] {
        match self {
            Preset::Bench => [("speech-lora", 32), ("vision-lora", 24)],
            Preset::Phi4mm => [("speech-lora", 320), ("vision-lora", 256)],
        }
    }
}

/// The benchmark config: text decoder of the issue; tiny vision/audio towers (not benchmarked) so
/// that the file is a complete, loadable Phi4MM checkpoint; LoRA ranks of the batching benchmark.
fn bench_config() -> serde_json::Value {
    let rotary_half = 24; // head_dim 64 × 0.75 / 2
    let long: Vec<f64> = (0..rotary_half).map(|i| 1.0 + i as f64 * 0.5).collect();
    json!({
        "architectures": ["Phi4MultimodalForCausalLM"],
        "model_type": "phi4_multimodal",
        "vocab_size": 200064, "hidden_size": 1024, "intermediate_size": 2816,
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
        "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                            "short_factor": vec![1.0; rotary_half], "long_factor": long},
        "tie_word_embeddings": true,
        "bos_token_id": 199999, "pad_token_id": 199999, "eos_token_id": [199999, 200020],
        "dtype": "bfloat16",
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
                          "num_attention_heads": 2, "image_size": 448, "patch_size": 14, "crop_size": 448,
                          "feature_layer": -2, "layer_norm_eps": 1e-6, "image_token_id": 200010},
        "audio_config": {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 48, "num_blocks": 2,
                         "nemo_conv_channels": 16, "bias_max_distance": 16, "ext_pw_out_channel": 32,
                         "depthwise_separable_out_channel": 32, "time_reduction": 8, "kernel_size": 3,
                         "input_size": 80, "audio_token_id": 200011}
    })
}

/// The released model's configuration in the transformers layout (`docs/phi4mm-model.md`
/// §2.1, §9.2 of the shared docs): text hidden 3072, 32 layers, 24 heads, 8 KV heads,
/// intermediate 8192; SigLIP 1152 × 27 layers; Conformer 1024 × 24 blocks. The LongRoPE factors
/// are made up (the weights are random; only the shapes and the cost matter).
fn phi4mm_config() -> serde_json::Value {
    let rotary_half = 48; // head_dim 128 × 0.75 / 2
    let long: Vec<f64> = (0..rotary_half).map(|i| 1.0 + i as f64 * 0.5).collect();
    json!({
        "architectures": ["Phi4MultimodalForCausalLM"],
        "model_type": "phi4_multimodal",
        "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
        "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                            "short_factor": vec![1.0; rotary_half], "long_factor": long},
        "tie_word_embeddings": true,
        "bos_token_id": 199999, "pad_token_id": 199999, "eos_token_id": [199999, 200020],
        "dtype": "bfloat16",
        "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                          "num_attention_heads": 16, "image_size": 448, "patch_size": 14, "crop_size": 448,
                          "feature_layer": -2, "layer_norm_eps": 1e-6, "image_token_id": 200010,
                          "hidden_act": "gelu_pytorch_tanh"},
        "audio_config": {"hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 1536,
                         "num_blocks": 24, "nemo_conv_channels": 1024, "bias_max_distance": 500,
                         "ext_pw_out_channel": 1024, "depthwise_separable_out_channel": 1024,
                         "time_reduction": 8, "kernel_size": 3, "input_size": 80,
                         "chunk_size": -1, "left_chunk": 18, "audio_token_id": 200011}
    })
}

/// splitmix64: a small, fast, seedable generator (reproducible weights without extra crates).
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-a, a).
    pub fn uniform(&mut self, a: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
}

pub fn to_bf16(v: f32) -> u16 {
    // Round to nearest even.
    let b = v.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Random bf16 bytes for a tensor: norms 1, everything else uniform with std 1/sqrt(fan_in).
fn random_tensor(name: &str, shape: &[usize], seed: u64) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let is_norm = name.contains("norm") && name.ends_with(".weight");
    let fan_in = if shape.len() >= 2 {
        shape[1..].iter().product::<usize>()
    } else {
        1
    };
    let a = (3.0 / fan_in as f32).sqrt();
    let mut rng = SplitMix(
        seed ^ name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        }),
    );
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        let v = if is_norm {
            1.0
        } else if name.contains("invstd") {
            0.25
        } else {
            rng.uniform(a)
        };
        out.extend_from_slice(&to_bf16(v).to_le_bytes());
    }
    out
}

/// Writes a bf16 safetensors file tensor by tensor, generating each just before it is written,
/// so memory holds one window of tensors (≤ `WINDOW_BYTES`, or one larger tensor) rather than the
/// whole 11 GB of the real-scale preset.
fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>)],
    generate: impl Fn(&str, &[usize]) -> Vec<u8> + Sync,
) -> Result<()> {
    const WINDOW_BYTES: usize = 1 << 30;
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in tensors {
        let bytes = 2 * shape.iter().product::<usize>();
        header.insert(
            name.clone(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut head = serde_json::to_vec(&header)?;
    // The data starts 8-byte aligned (the format's padding, with spaces).
    head.resize(head.len().div_ceil(8) * 8, b' ');
    let mut out = BufWriter::with_capacity(1 << 22, std::fs::File::create(path)?);
    out.write_all(&(head.len() as u64).to_le_bytes())?;
    out.write_all(&head)?;
    let mut start = 0;
    while start < tensors.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < tensors.len() && (end == start || bytes < WINDOW_BYTES) {
            bytes += 2 * tensors[end].1.iter().product::<usize>();
            end += 1;
        }
        let window: Vec<Vec<u8>> = tensors[start..end]
            .par_iter()
            .map(|(name, shape)| generate(name, shape))
            .collect();
        for data in window {
            out.write_all(&data)?;
        }
        start = end;
    }
    out.flush()?;
    Ok(())
}

pub fn bench_checkpoint(args: BenchCheckpointArgs) -> Result<()> {
    let dir = &args.out;
    let holds_files = std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if holds_files && !args.force {
        anyhow::bail!(
            "{} is not empty: bench-checkpoint writes random weights and would replace a \
             checkpoint's files there; give a new or empty folder, or --force",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    let mut cfg = args.preset.config();
    if let Some(layers) = args.vision_layers {
        let v = &mut cfg["vision_config"];
        v["hidden_size"] = json!(1152);
        v["intermediate_size"] = json!(4304);
        v["num_attention_heads"] = json!(16);
        // The feature layer is the second to last: at least two layers so that one runs.
        v["num_hidden_layers"] = json!(layers.max(2));
    }
    if let Some(layers) = args.text_layers {
        cfg["num_hidden_layers"] = json!(layers.max(1));
    }
    if let Some(blocks) = args.audio_blocks {
        let mut audio = phi4mm_config()["audio_config"].take();
        audio["num_blocks"] = json!(blocks.max(1));
        cfg["audio_config"] = audio;
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    std::fs::write(
        dir.join("generation_config.json"),
        serde_json::to_string_pretty(
            &json!({"bos_token_id": 199999, "pad_token_id": 199999, "eos_token_id": [200020, 199999]}),
        )?,
    )?;
    for (folder, r) in args.preset.lora_ranks() {
        std::fs::create_dir_all(dir.join(folder))?;
        std::fs::write(
            dir.join(folder).join("adapter_config.json"),
            serde_json::to_string_pretty(
                &json!({"peft_type": "LORA", "r": r, "lora_alpha": 2 * r,
                "target_modules": "model.layers.\\d+.((self_attn.(qkv|o)_proj)|(mlp.(gate_up|down)_proj))"}),
            )?,
        )?;
    }
    let parsed = config::parse_config(dir, &cfg, Layout::Transformers)?;
    let schema = expected_schema(&parsed);
    let base: Vec<(String, Vec<usize>)> = schema
        .iter()
        .map(|(name, (shape, _))| (name.clone(), shape.clone()))
        .collect();
    let params: usize = base.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    write_safetensors(&dir.join("model.safetensors"), &base, |name, shape| {
        random_tensor(name, shape, args.seed)
    })?;
    let mut lora_params = 0;
    for (folder, r) in args.preset.lora_ranks() {
        let mut tensors = Vec::new();
        for layer in 0..parsed.text.num_layers {
            for module in switchyard_phi4mm::checkpoint::layout::LORA_TARGETS {
                let (din, dout) =
                    switchyard_phi4mm::checkpoint::schema::module_dims(&parsed, module).unwrap();
                for (ab, shape) in [("A", vec![r, din]), ("B", vec![dout, r])] {
                    lora_params += shape.iter().product::<usize>();
                    let name =
                        format!("base_model.model.model.layers.{layer}.{module}.lora_{ab}.weight");
                    tensors.push((name, shape));
                }
            }
        }
        write_safetensors(
            &dir.join(folder).join("adapter_model.safetensors"),
            &tensors,
            |name, shape| random_tensor(&format!("{folder}/{name}"), shape, args.seed),
        )?;
    }
    println!(
        "{}",
        json!({"written": dir, "tensors": schema.len(), "base_parameters": params,
               "lora_parameters": lora_params, "parameters": params + lora_params})
    );
    Ok(())
}
