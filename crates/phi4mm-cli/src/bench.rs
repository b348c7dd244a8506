//! `phi4mm bench` measures the host backend on a checkpoint (e.g. one `phi4mm bench-checkpoint`
//! wrote): memory read bandwidth, peak FMA GFLOP/s, bf16 GEMM GFLOP/s, time to first token (and
//! prefill as a fraction of the compute bound), and per kernel path the
//! batch-1 decode, the LM head alone and the layers' linears alone as fractions of the bandwidth
//! bound; attention over a long KV cache; the pool's fork-join cost. All in one run, so the
//! ratios are comparable on a noisy shared machine.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use rayon::prelude::*;
use serde_json::json;
use switchyard_phi4mm::adapter::AdapterMode;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::kernels::linear::{linear, Matrix};
use switchyard_phi4mm::kernels::matmul::sgemm;
use switchyard_phi4mm::kernels::path::{self, KernelPath};
use switchyard_phi4mm::model::{Phi4mm, SequenceState};

use crate::bench_checkpoint::{to_bf16, SplitMix};
use crate::bounds::{layer_linears, prefill_flops, DecodeBytes, MachineBounds};
use switchyard_phi4mm::sampling::argmax;
use switchyard_phi4mm::step::StepRow;

#[derive(Args)]
pub struct BenchArgs {
    /// Checkpoint directory (e.g. one written by `phi4mm bench-checkpoint`).
    #[arg(long)]
    model: PathBuf,
    /// Worker threads (0 = one per core).
    #[arg(long, default_value_t = 0, value_parser = crate::ranges::threads)]
    threads: usize,
    #[arg(long, default_value_t = 128, value_parser = crate::ranges::at_least_one)]
    prompt_tokens: usize,
    /// Tokens per decode figure: the first, then the steps that are timed (at least 2).
    #[arg(long, default_value_t = 32, value_parser = crate::ranges::at_least_two)]
    new_tokens: usize,
    /// Bytes of the buffer the read-bandwidth test streams (well above any cache).
    #[arg(long, default_value_t = 1 << 30, value_parser = crate::ranges::at_least_one)]
    bandwidth_bytes: usize,
    /// Rounds of the per-path decode and LM-head figures (paths interleaved in each round; best
    /// of the rounds).
    #[arg(long, default_value_t = 3, value_parser = crate::ranges::at_least_one)]
    rounds: usize,
    /// Only this kernel path (`avx512`, `avx2`, `scalar`); default: every path the CPU has.
    #[arg(long)]
    kernel_path: Option<String>,
    /// Context length of the attention figure (a second prompt this long, then decode steps).
    #[arg(long, default_value_t = 2048)]
    long_context: usize,
}

/// Refuses a prompt (`option`'s `tokens`) that, with `new_tokens` after it, does not fit the
/// checkpoint's positions, before the minutes its prefill would take.
pub fn within_context(
    c: &switchyard_phi4mm::checkpoint::TextConfig,
    option: &str,
    tokens: usize,
    new_tokens: usize,
) -> Result<()> {
    let positions = c.max_position_embeddings;
    anyhow::ensure!(
        tokens
            .checked_add(new_tokens)
            .is_some_and(|n| n <= positions),
        "{option} {tokens} plus {new_tokens} new tokens exceeds the checkpoint's \
         {positions} positions (max_position_embeddings)"
    );
    Ok(())
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

/// Kernel paths to measure: the one named, or every path this CPU supports.
fn paths_to_run(named: Option<&str>) -> Result<Vec<KernelPath>> {
    match named {
        Some(n) => {
            let p = path::parse(n)
                .map_err(|e| anyhow::anyhow!("--kernel-path: {e}"))?
                .unwrap_or_else(KernelPath::detected);
            anyhow::ensure!(
                p.supported(),
                "--kernel-path: {}",
                path::Unsupported(p, KernelPath::detected())
            );
            Ok(vec![p])
        }
        None => Ok(KernelPath::ALL
            .into_iter()
            .filter(|p| p.supported())
            .collect()),
    }
}

/// Decoder state after a prompt, and the first generated token.
fn prefill(model: &Phi4mm, ids: &[u32]) -> (SequenceState, u32, f64) {
    let embeds = model.decoder.embed(ids);
    let mut state = model.decoder.new_sequence();
    let t = Instant::now();
    let logits = model
        .decoder
        .step(&mut [StepRow {
            state: &mut state,
            embeds: &embeds,
            adapter: AdapterMode::None,
        }])
        .remove(0);
    (state, argmax(&logits), t.elapsed().as_secs_f64())
}

/// Greedy decode of `steps` tokens from a copy of `start`; seconds per token and the tokens.
fn decode(model: &Phi4mm, start: &SequenceState, first: u32, steps: usize) -> (f64, Vec<u32>) {
    let mut state = start.clone();
    let mut tokens = vec![first];
    let t = Instant::now();
    for _ in 0..steps {
        let e = model.decoder.embed(&tokens[tokens.len() - 1..]);
        let logits = model
            .decoder
            .step(&mut [StepRow {
                state: &mut state,
                embeds: &e,
                adapter: AdapterMode::None,
            }])
            .remove(0);
        tokens.push(argmax(&logits));
    }
    (t.elapsed().as_secs_f64() / steps.max(1) as f64, tokens)
}

/// Fastest of `reps` runs of `f`, in seconds.
fn best_s(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// A deterministic prompt of `tokens` ordinary token ids: below the special ones past 199999,
/// and within a small vocabulary (the fixture's) too.
pub fn prompt_ids(tokens: usize, vocab_size: usize) -> Vec<u32> {
    let ordinary = vocab_size.min(199_000) as u32;
    (0..tokens as u32)
        .map(|i| (i * 7919 + 13) % ordinary)
        .collect()
}

/// Per-path figures of one round.
#[derive(Clone, Copy)]
struct PathFigures {
    decode_s: f64,
    lm_head_s: f64,
    linears_s: f64,
}

impl PathFigures {
    fn best(self, o: PathFigures) -> PathFigures {
        PathFigures {
            decode_s: self.decode_s.min(o.decode_s),
            lm_head_s: self.lm_head_s.min(o.lm_head_s),
            linears_s: self.linears_s.min(o.linears_s),
        }
    }
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let paths = paths_to_run(args.kernel_path.as_deref())?;
    let t = Instant::now();
    let ck = Checkpoint::open(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let load_s = t.elapsed().as_secs_f64();
    let model = Phi4mm::load(&ck, args.threads);
    let c = &model.config.text;
    within_context(c, "--prompt-tokens", args.prompt_tokens, args.new_tokens)?;
    within_context(c, "--long-context", args.long_context, args.new_tokens)?;

    let linears = layer_linears(&ck, c.num_layers);
    let DecodeBytes {
        linears: linear_bytes,
        head: head_bytes,
    } = DecodeBytes::of(&ck, c);
    let weight_bytes = linear_bytes + head_bytes;

    let (mut machine, (gemm_bf16, gemm_f32_1t), fork_join_s) = model.install(|| {
        (
            MachineBounds::measure(args.bandwidth_bytes),
            gemm_gflops(64, 1024, 1024),
            fork_join_cost(),
        )
    });

    let ids = prompt_ids(args.prompt_tokens, c.vocab_size);
    let steps = args.new_tokens - 1;
    // The first prefill also faults the mapped weights in; the timed ones find them resident,
    // as a serving process does.
    let (start, first, _) = model.install(|| prefill(&model, &ids));
    let ttft = (0..args.rounds.max(1))
        .map(|_| model.install(|| prefill(&model, &ids)).2)
        .fold(f64::INFINITY, f64::min);
    let prefill_flops = prefill_flops(&ck, c, args.prompt_tokens);

    // Per path, interleaved in every round: the decode step, the LM head alone, the layers'
    // linears alone (the same GEMVs the step runs, on one normed-looking input row).
    let hidden: Vec<f32> = (0..c.hidden_size)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let inputs: Vec<Vec<f32>> = linears
        .iter()
        .map(|m| {
            (0..m.in_dim)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                .collect()
        })
        .collect();
    let mut outputs: Vec<Vec<f32>> = linears.iter().map(|m| vec![0.0; m.out_dim]).collect();
    let mut best: Vec<Option<PathFigures>> = vec![None; paths.len()];
    let mut tokens = Vec::new();
    for _ in 0..args.rounds.max(1) {
        for (i, &p) in paths.iter().enumerate() {
            path::force(Some(p))?;
            let f = model.install(|| {
                let (decode_s, toks) = decode(&model, &start, first, steps);
                tokens = toks;
                let lm_head_s = best_s(3, || {
                    std::hint::black_box(model.decoder.logits(&hidden));
                });
                let linears_s = best_s(3, || {
                    for ((m, x), y) in linears.iter().zip(&inputs).zip(&mut outputs) {
                        linear(x, 1, *m, None, y);
                    }
                });
                PathFigures {
                    decode_s,
                    lm_head_s,
                    linears_s,
                }
            });
            best[i] = Some(best[i].map_or(f, |b| b.best(f)));
        }
    }
    path::force(None)?;
    let chosen = path::active();
    model.install(|| machine.measure_again(args.bandwidth_bytes));
    let (bw, peak) = (machine.read_bandwidth, machine.peak_gflops);

    // Attention over the KV cache: the same decode after a long prompt; the extra time per step
    // is the attention over the extra positions (each step reads their f32 keys and values).
    let attention = if args.long_context > args.prompt_tokens {
        let long_ids = prompt_ids(args.long_context, c.vocab_size);
        let (long_start, long_first, _) = model.install(|| prefill(&model, &long_ids));
        let short_s = model.install(|| decode(&model, &start, first, steps).0);
        let long_s = model.install(|| decode(&model, &long_start, long_first, steps).0);
        let kv_row_bytes = 2 * c.num_kv_heads * c.head_dim * 4;
        let extra_kv_bytes =
            (c.num_layers * kv_row_bytes * (args.long_context - args.prompt_tokens)) as f64;
        json!({
            "long_context": args.long_context,
            "decode_ms_per_token_short": short_s * 1e3,
            "decode_ms_per_token_long": long_s * 1e3,
            "extra_kv_bytes_per_step": extra_kv_bytes,
            "extra_ms_per_step": (long_s - short_s) * 1e3,
            "extra_gb_s": extra_kv_bytes / (long_s - short_s).max(1e-9) / 1e9,
            "kv_cache_allocated_bytes_long": long_start.kv_allocated_bytes(),
        })
    } else {
        serde_json::Value::Null
    };

    let bound = weight_bytes as f64 / bw;
    let head_bound = head_bytes as f64 / bw;
    let linear_bound = linear_bytes as f64 / bw;
    let mut by_path = serde_json::Map::new();
    for (p, f) in paths.iter().zip(&best) {
        let f = f.expect("every path ran at least one round");
        by_path.insert(
            p.name().into(),
            json!({
                "decode_tokens_per_s": 1.0 / f.decode_s,
                "decode_ms_per_token": f.decode_s * 1e3,
                "fraction_of_bandwidth_bound": bound / f.decode_s,
                "lm_head_ms": f.lm_head_s * 1e3,
                "lm_head_fraction_of_bound": head_bound / f.lm_head_s,
                "layer_linears_ms": f.linears_s * 1e3,
                "layer_linears_fraction_of_bound": linear_bound / f.linears_s,
                "rest_of_step_ms": (f.decode_s - f.lm_head_s - f.linears_s) * 1e3,
            }),
        );
    }
    let main = best[paths.iter().position(|&p| p == chosen).unwrap_or(0)]
        .expect("every path ran at least one round");
    let mut report = json!({
        "machine": {"threads": model.threads(), "cpu": cpu_name(), "load_average": load_average()},
        "kernel_path": chosen.name(),
        "config": {"hidden": c.hidden_size, "intermediate": c.intermediate_size, "layers": c.num_layers,
                   "heads": c.num_heads, "kv_heads": c.num_kv_heads, "vocab": c.vocab_size},
        "checkpoint_open_s": load_s,
        "read_bandwidth_gb_s": bw / 1e9,
        "gemm_64x1024x1024_gflops_bf16_linear": gemm_bf16,
        "gemm_64x1024x1024_gflops_f32_sgemm_1thread": gemm_f32_1t,
        "prompt_tokens": args.prompt_tokens,
        "time_to_first_token_ms": ttft * 1e3,
        "prefill_tokens_per_s": args.prompt_tokens as f64 / ttft,
        "prefill_gflops": prefill_flops / ttft / 1e9,
        "peak_gflops": peak,
        "peak_vector_path": machine.peak_vector_path,
        "prefill_fraction_of_peak": prefill_flops / ttft / 1e9 / peak,
        "decode_tokens_per_s": 1.0 / main.decode_s,
        "decode_ms_per_token": main.decode_s * 1e3,
        "weight_bytes_per_token": weight_bytes,
        "lm_head_bytes": head_bytes,
        "bandwidth_bound_ms_per_token": bound * 1e3,
        "fraction_of_bandwidth_bound": bound / main.decode_s,
        "by_kernel_path": by_path,
        "rounds": args.rounds,
        "attention": attention,
        "fork_join_us": fork_join_s * 1e6,
        // f32 keys and values of every layer, per position of one row.
        "kv_bytes_per_position": c.num_layers * 2 * c.num_kv_heads * c.head_dim * 4,
        "tokens": tokens,
    });
    machine.record_measurements(&mut report);
    println!("{report}");
    Ok(())
}

/// One empty fork-join over the pool (what each parallel GEMV pays to hand work to the threads
/// and wait for them): the mean over many, since the best case (the caller runs every task
/// itself before a worker wakes) hides the hand-off.
fn fork_join_cost() -> f64 {
    let threads = rayon::current_num_threads();
    let reps = 2000;
    let t = Instant::now();
    for _ in 0..reps {
        (0..threads * 4).into_par_iter().for_each(|i| {
            std::hint::black_box(i);
        });
    }
    t.elapsed().as_secs_f64() / reps as f64
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), recorded beside every benchmark's
/// figures as numbers, the same shape in every command's JSON.
pub fn load_average() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| {
            s.split_whitespace()
                .take(3)
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default()
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
