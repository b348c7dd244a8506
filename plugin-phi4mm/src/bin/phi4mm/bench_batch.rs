//! `phi4mm bench-batch`: batched decoding on the benchmark checkpoint, on the host backend and
//! (with `--backend both` in a build with the `iree` feature) on the IREE backend, side by side in
//! one run so the ratios are comparable on a noisy machine:
//! - prefill tokens/s of one prompt;
//! - decode tokens/s at batch 1 and batch 8 (all rows base);
//! - a mixed-adapter batch of 8 (base, speech, vision rows) against the base-only batch of 8.
//!
//! Every figure is the best of `--rounds` rounds; the configurations alternate inside each round
//! so a burst of load from another process hits all of them alike.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::{argmax, AdapterMode, Phi4mm};
use switchyard_phi4mm::scheduler::{HostBackend, StepBackend, StepRow};

use crate::generate::IreeArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Which {
    Host,
    Iree,
    Both,
}

#[derive(Args)]
pub struct BenchBatchArgs {
    /// Checkpoint directory (e.g. one written by `phi4mm bench-checkpoint`).
    #[arg(long)]
    model: PathBuf,
    #[arg(long, value_enum, default_value = "host")]
    backend: Which,
    /// Worker threads of the host backend (0 = one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Decode steps timed per configuration.
    #[arg(long, default_value_t = 16)]
    new_tokens: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[command(flatten)]
    iree: IreeArgs,
}

/// The mixed batch: base, speech and vision rows interleaved.
const MIXED: [AdapterMode; 8] = [
    AdapterMode::None,
    AdapterMode::Speech,
    AdapterMode::Vision,
    AdapterMode::None,
    AdapterMode::Speech,
    AdapterMode::Vision,
    AdapterMode::None,
    AdapterMode::Speech,
];

/// Prefills one row per mode, then times `steps` decode steps of all rows together. Returns
/// (prefill seconds of the first row, decode tokens per second over all rows).
fn run_batch<B: StepBackend>(
    b: &B,
    prompt: &[f32],
    modes: &[AdapterMode],
    steps: usize,
) -> (f64, f64) {
    let mut states: Vec<B::State> = modes.iter().map(|_| b.new_state()).collect();
    let mut next = Vec::with_capacity(modes.len());
    let mut prefill_s = 0.0;
    for (i, (st, &m)) in states.iter_mut().zip(modes).enumerate() {
        let t = Instant::now();
        let logits = b
            .step(&mut [StepRow {
                state: st,
                embeds: prompt,
                adapter: m,
            }])
            .remove(0);
        if i == 0 {
            prefill_s = t.elapsed().as_secs_f64();
        }
        next.push(argmax(&logits));
    }
    let t = Instant::now();
    for _ in 0..steps {
        let embeds: Vec<Vec<f32>> = next.iter().map(|&id| b.embed(&[id])).collect();
        let mut rows: Vec<StepRow<'_, B::State>> = states
            .iter_mut()
            .zip(&embeds)
            .zip(modes)
            .map(|((st, e), &m)| StepRow {
                state: st,
                embeds: e,
                adapter: m,
            })
            .collect();
        let logits = b.step(&mut rows);
        next = logits.iter().map(|l| argmax(l)).collect();
    }
    let secs = t.elapsed().as_secs_f64();
    (prefill_s, (steps * modes.len()) as f64 / secs)
}

/// Best-of-rounds figures of one backend.
#[derive(Default, Clone, Copy)]
struct Figures {
    prefill_tok_s: f64,
    b1: f64,
    b8: f64,
    b8_mixed: f64,
}

impl Figures {
    fn merge_best(&mut self, o: Figures) {
        self.prefill_tok_s = self.prefill_tok_s.max(o.prefill_tok_s);
        self.b1 = self.b1.max(o.b1);
        self.b8 = self.b8.max(o.b8);
        self.b8_mixed = self.b8_mixed.max(o.b8_mixed);
    }

    fn json(&self) -> Value {
        json!({
            "prefill_tokens_per_s": self.prefill_tok_s,
            "decode_tokens_per_s_batch1": self.b1,
            "decode_tokens_per_s_batch8": self.b8,
            "decode_tokens_per_s_batch8_mixed_adapters": self.b8_mixed,
            "batch8_over_batch1": self.b8 / self.b1,
            // Extra time per step of the mixed batch relative to the base-only batch.
            "mixed_extra_time": self.b8 / self.b8_mixed - 1.0,
        })
    }
}

fn one_round<B: StepBackend>(b: &B, prompt: &[f32], n: usize, steps: usize) -> Figures {
    let (p, b1) = run_batch(b, prompt, &[AdapterMode::None], steps);
    let (_, b8) = run_batch(b, prompt, &[AdapterMode::None; 8], steps);
    let (_, mixed) = run_batch(b, prompt, &MIXED, steps);
    Figures {
        prefill_tok_s: n as f64 / p,
        b1,
        b8,
        b8_mixed: mixed,
    }
}

pub fn run(args: BenchBatchArgs) -> Result<()> {
    let ck = Checkpoint::open(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let model = Arc::new(Phi4mm::load(&ck, args.threads));
    let ids: Vec<u32> = (0..args.prompt_tokens as u32)
        .map(|i| (i * 7919 + 13) % 199_000)
        .collect();
    let prompt = model.decoder.embed(&ids);
    let host = HostBackend(model.clone());
    let iree = if args.backend != Which::Host {
        Some(load_iree(&ck, model.clone(), &args)?)
    } else {
        None
    };
    let mut host_best = Figures::default();
    let mut iree_best = Figures::default();
    for _ in 0..args.rounds.max(1) {
        if args.backend != Which::Iree {
            let f =
                model.install(|| one_round(&host, &prompt, args.prompt_tokens, args.new_tokens));
            host_best.merge_best(f);
        }
        if let Some(b) = &iree {
            iree_best.merge_best(iree_round(b, &prompt, &args));
        }
    }
    let c = &model.config.text;
    let mut report = json!({
        "machine": {"cpu": crate::bench::cpu_name(), "host_threads": model.threads()},
        "config": {"hidden": c.hidden_size, "layers": c.num_layers, "vocab": c.vocab_size,
                   "speech_lora_r": model.config.speech_lora.map(|l| l.r),
                   "vision_lora_r": model.config.vision_lora.map(|l| l.r)},
        "prompt_tokens": args.prompt_tokens,
        "decode_steps": args.new_tokens,
        "rounds": args.rounds,
    });
    if args.backend != Which::Iree {
        report["host"] = host_best.json();
    }
    if iree.is_some() {
        report["iree"] = iree_best.json();
        if args.backend == Which::Both {
            report["iree_over_host"] = json!({
                "prefill": iree_best.prefill_tok_s / host_best.prefill_tok_s,
                "decode_batch1": iree_best.b1 / host_best.b1,
                "decode_batch8": iree_best.b8 / host_best.b8,
            });
        }
    }
    println!("{report}");
    Ok(())
}

#[cfg(feature = "iree")]
type IreeBench = switchyard_phi4mm::iree::backend::IreeBackend;
#[cfg(not(feature = "iree"))]
type IreeBench = ();

#[cfg(feature = "iree")]
fn load_iree(ck: &Checkpoint, model: Arc<Phi4mm>, args: &BenchBatchArgs) -> Result<IreeBench> {
    let mut s = args.iree.settings();
    // Enough positions for the prompt and the timed steps; a smaller cache is less to copy.
    s.context = s.context.min(args.prompt_tokens + args.new_tokens + 8);
    IreeBench::load(ck, model, &s)
}

#[cfg(not(feature = "iree"))]
fn load_iree(_: &Checkpoint, _: Arc<Phi4mm>, _: &BenchBatchArgs) -> Result<IreeBench> {
    anyhow::bail!("this phi4mm was built without the `iree` feature")
}

#[cfg(feature = "iree")]
fn iree_round(b: &IreeBench, prompt: &[f32], args: &BenchBatchArgs) -> Figures {
    one_round(b, prompt, args.prompt_tokens, args.new_tokens)
}

#[cfg(not(feature = "iree"))]
fn iree_round(_: &IreeBench, _: &[f32], _: &BenchBatchArgs) -> Figures {
    unreachable!("load_iree fails without the feature")
}
