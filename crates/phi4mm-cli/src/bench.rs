//! `phi4mm bench-checkpoint` writes a random bf16 checkpoint in the transformers layout for the
//! benchmark config of the model issue; `phi4mm bench` measures the host backend on it: memory
//! read bandwidth, bf16 GEMM GFLOP/s, time to first token and batch-1 decode tokens/s, all in one
//! run so the ratios are comparable on a noisy shared machine.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use rayon::prelude::*;
use serde_json::json;
use switchyard_phi4mm::adapter::AdapterMode;
use switchyard_phi4mm::checkpoint::schema::expected_schema;
use switchyard_phi4mm::checkpoint::{config, Checkpoint, Layout};
use switchyard_phi4mm::kernels::linear::{linear, Matrix};
use switchyard_phi4mm::kernels::matmul::sgemm;
use switchyard_phi4mm::model::Phi4mm;
use switchyard_phi4mm::sampling::argmax;
use switchyard_phi4mm::step::StepRow;

#[derive(Args)]
pub struct BenchCheckpointArgs {
    /// Output directory (created).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the weight generator.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Give the checkpoint a real-dimension SigLIP tower (hidden 1152, MLP 4304, 16 heads) with
    /// this many layers (the feature layer is the second to last, so one fewer run), for
    /// `bench-vision`. Default: the tiny tower.
    #[arg(long)]
    vision_layers: Option<usize>,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Checkpoint directory (e.g. one written by `phi4mm bench-checkpoint`).
    #[arg(long)]
    model: PathBuf,
    /// Worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 32)]
    new_tokens: usize,
    /// Bytes of the buffer the read-bandwidth test streams (well above any cache).
    #[arg(long, default_value_t = 1 << 30)]
    bandwidth_bytes: usize,
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

/// splitmix64: a small, fast, seedable generator (reproducible weights without extra crates).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-a, a).
    fn uniform(&mut self, a: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
    }
}

fn to_bf16(v: f32) -> u16 {
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

fn write_safetensors(path: &Path, tensors: Vec<(String, Vec<usize>, Vec<u8>)>) -> Result<()> {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, d)| {
            Ok((
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), d)?,
            ))
        })
        .collect::<Result<_>>()?;
    safetensors::serialize_to_file(views, None, path)?;
    Ok(())
}

pub fn bench_checkpoint(args: BenchCheckpointArgs) -> Result<()> {
    let dir = &args.out;
    std::fs::create_dir_all(dir)?;
    let mut cfg = bench_config();
    if let Some(layers) = args.vision_layers {
        let v = &mut cfg["vision_config"];
        v["hidden_size"] = json!(1152);
        v["intermediate_size"] = json!(4304);
        v["num_attention_heads"] = json!(16);
        v["num_hidden_layers"] = json!(layers.max(2));
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    std::fs::write(
        dir.join("generation_config.json"),
        serde_json::to_string_pretty(
            &json!({"bos_token_id": 199999, "pad_token_id": 199999, "eos_token_id": [200020, 199999]}),
        )?,
    )?;
    for (folder, r) in [("speech-lora", 32), ("vision-lora", 24)] {
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
    let base: Vec<_> = schema
        .par_iter()
        .map(|(name, (shape, _))| {
            (
                name.clone(),
                shape.clone(),
                random_tensor(name, shape, args.seed),
            )
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), base)?;
    for (folder, r) in [("speech-lora", 32usize), ("vision-lora", 24)] {
        let mut tensors = Vec::new();
        for layer in 0..parsed.text.num_layers {
            for module in switchyard_phi4mm::checkpoint::layout::LORA_TARGETS {
                let (din, dout) =
                    switchyard_phi4mm::checkpoint::schema::module_dims(&parsed, module).unwrap();
                for (ab, shape) in [("A", vec![r, din]), ("B", vec![dout, r])] {
                    let name =
                        format!("base_model.model.model.layers.{layer}.{module}.lora_{ab}.weight");
                    let data = random_tensor(&format!("{folder}/{name}"), &shape, args.seed);
                    tensors.push((name, shape, data));
                }
            }
        }
        write_safetensors(&dir.join(folder).join("adapter_model.safetensors"), tensors)?;
    }
    println!("{}", json!({"written": dir, "tensors": schema.len()}));
    Ok(())
}

/// Best-of-3 multithreaded read bandwidth in bytes/s (sums a buffer far larger than the caches).
fn read_bandwidth(bytes: usize) -> f64 {
    let n = bytes / 8;
    let buf: Vec<u64> = (0..n as u64)
        .into_par_iter()
        .map(|i| i.wrapping_mul(0x9e37_79b9))
        .collect();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
            .reduce(|| 0, u64::wrapping_add);
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max(bytes as f64 / secs);
    }
    best
}

/// GFLOP/s of `[m, k] × [k, n]` through the model's bf16 linear path and plain f32 sgemm.
fn gemm_gflops(m: usize, k: usize, n: usize) -> (f64, f64) {
    let mut rng = SplitMix(1);
    let x: Vec<f32> = (0..m * k).map(|_| rng.uniform(1.0)).collect();
    let wb: Vec<u16> = (0..n * k).map(|_| to_bf16(rng.uniform(0.05))).collect();
    let wf: Vec<f32> = wb
        .iter()
        .map(|&b| f32::from_bits((b as u32) << 16))
        .collect();
    let w = Matrix {
        data: switchyard_phi4mm::checkpoint::WeightData::Bf16(&wb),
        out_dim: n,
        in_dim: k,
    };
    let mut y = vec![0.0; m * n];
    let flops = 2.0 * (m * k * n) as f64;
    let time = |f: &mut dyn FnMut()| {
        f();
        let reps = 20;
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_secs_f64() / reps as f64
    };
    let bf16 = time(&mut || linear(&x, m, w, None, &mut y));
    // f32 reference: a single sgemm call, single-threaded (matrixmultiply without threading).
    let mut y2 = vec![0.0; m * n];
    let f32_single = time(&mut || sgemm(m, k, n, &x, k, 1, &wf, 1, k, &mut y2, n));
    (flops / bf16 / 1e9, flops / f32_single / 1e9)
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let t = Instant::now();
    let ck = Checkpoint::open(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let load_s = t.elapsed().as_secs_f64();
    let model = Phi4mm::load(&ck, args.threads);
    let c = &model.config.text;

    // Bytes one decode token reads: every decoder linear + the tied LM head (an embedding lookup
    // reads one row).
    let mut weight_bytes = ck.tensor("model.embed_tokens.weight").size_bytes();
    for name in ck.tensor_names() {
        if name.starts_with("model.layers.") && name.ends_with("_proj.weight") {
            weight_bytes += ck.tensor(name).size_bytes();
        }
    }

    let (bw, (gemm_bf16, gemm_f32_1t)) = model.install(|| {
        (
            read_bandwidth(args.bandwidth_bytes),
            gemm_gflops(64, 1024, 1024),
        )
    });

    // A deterministic prompt of ordinary token ids.
    let ids: Vec<u32> = (0..args.prompt_tokens as u32)
        .map(|i| (i * 7919 + 13) % 199_000)
        .collect();
    let embeds = model.decoder.embed(&ids);
    let (ttft, decode_s, tokens) = model.install(|| {
        let mut state = model.decoder.new_sequence();
        let t = Instant::now();
        let mut logits = model
            .decoder
            .step(&mut [StepRow {
                state: &mut state,
                embeds: &embeds,
                adapter: AdapterMode::None,
            }])
            .remove(0);
        let ttft = t.elapsed().as_secs_f64();
        let mut tokens = vec![argmax(&logits)];
        let t = Instant::now();
        for _ in 1..args.new_tokens {
            let e = model.decoder.embed(&tokens[tokens.len() - 1..]);
            logits = model
                .decoder
                .step(&mut [StepRow {
                    state: &mut state,
                    embeds: &e,
                    adapter: AdapterMode::None,
                }])
                .remove(0);
            tokens.push(argmax(&logits));
        }
        (ttft, t.elapsed().as_secs_f64(), tokens)
    });
    let decode_steps = (args.new_tokens - 1).max(1) as f64;
    let per_token = decode_s / decode_steps;
    let bound = weight_bytes as f64 / bw;
    let report = json!({
        "machine": {"threads": model.threads(), "cpu": cpu_name()},
        "config": {"hidden": c.hidden_size, "intermediate": c.intermediate_size, "layers": c.num_layers,
                   "heads": c.num_heads, "kv_heads": c.num_kv_heads, "vocab": c.vocab_size},
        "checkpoint_open_s": load_s,
        "read_bandwidth_gb_s": bw / 1e9,
        "gemm_64x1024x1024_gflops_bf16_linear": gemm_bf16,
        "gemm_64x1024x1024_gflops_f32_sgemm_1thread": gemm_f32_1t,
        "prompt_tokens": args.prompt_tokens,
        "time_to_first_token_ms": ttft * 1e3,
        "prefill_tokens_per_s": args.prompt_tokens as f64 / ttft,
        "decode_tokens_per_s": 1.0 / per_token,
        "decode_ms_per_token": per_token * 1e3,
        "weight_bytes_per_token": weight_bytes,
        "bandwidth_bound_ms_per_token": bound * 1e3,
        "fraction_of_bandwidth_bound": bound / per_token,
        "tokens": tokens,
    });
    println!("{report}");
    Ok(())
}

pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default()
}
