//! `phi4mm bench-batch`: batched decoding on the benchmark checkpoint, on the host backend and
//! (with `--backend both` in a build with the `iree` feature) on the IREE backend, side by side in
//! one run so the ratios are comparable on a noisy machine:
//! - prefill tokens/s of one prompt;
//! - decode tokens/s at batch 1 and batch 8 (all rows base);
//! - a mixed-adapter batch of 8 (base, speech, vision rows) against the base-only batch of 8;
//! - the encoders' time on a 30 s clip and on a 1344×896 image.
//!
//! Every figure is the best of `--rounds` rounds; the configurations and the backends alternate
//! inside each round so a burst of load from another process hits all of them alike. Each ratio
//! of the backends is also given as the median of the rounds' own ratios
//! (`iree_over_host_median_of_rounds`), which a drift of the machine's speed between rounds moves
//! less than it moves the best of each.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use switchyard_phi4mm::adapter::{AdapterMode, AudioBranch};
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::{AudioInput, HostBackend, ImageInput, Phi4mm};
use switchyard_phi4mm::request;
use switchyard_phi4mm::sampling::argmax;
use switchyard_phi4mm::step::{StepBackend, StepRow};
use switchyard_phi4mm_frontend::audio::AudioOptions;

use crate::bounds;
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
    #[arg(long, default_value_t = 0, value_parser = crate::ranges::threads)]
    threads: usize,
    #[arg(long, default_value_t = 128, value_parser = crate::ranges::at_least_one)]
    prompt_tokens: usize,
    /// Decode steps timed per configuration.
    #[arg(long, default_value_t = 16, value_parser = crate::ranges::at_least_one)]
    new_tokens: usize,
    #[arg(long, default_value_t = 3, value_parser = crate::ranges::at_least_one)]
    rounds: usize,
    /// Bytes of the buffer the read-bandwidth test streams (well above any cache).
    #[arg(long, default_value_t = 1 << 30, value_parser = crate::ranges::at_least_one)]
    bandwidth_bytes: usize,
    /// Time only the encoders (a 30 s clip, a 1344×896 image), not the decoder's rounds, which
    /// take most of a run with real-dimension towers.
    #[arg(long)]
    encoders_only: bool,
    #[command(flatten)]
    iree: IreeArgs,
}

/// A 30 s 16 kHz clip (a chirp plus noise) as log-mel features, and a 1344×896 image (gradients
/// plus noise) as crops: the encoder benchmark's inputs, made in memory.
pub fn encoder_inputs() -> Result<(AudioInput, ImageInput)> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut wav = std::io::Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut wav, spec)?;
    let mut seed = 12345u32;
    for i in 0..30 * 16_000u32 {
        let t = f64::from(i) / 16_000.0;
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let noise = f64::from(seed >> 16) / 65536.0 - 0.5;
        let v = 0.3 * (2.0 * std::f64::consts::PI * (200.0 + 100.0 * t) * t).sin() + 0.05 * noise;
        w.write_sample((v * 32767.0) as i16)?;
    }
    w.finalize()?;
    let audio = request::audio_input(wav.get_ref(), &AudioOptions::default())?;
    let rgb = ::image::RgbImage::from_fn(1344, 896, |x, y| {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        ::image::Rgb([(x / 6) as u8, (y / 4) as u8, (seed >> 24) as u8])
    });
    let p = switchyard_phi4mm_frontend::image::preprocess_rgb(&rgb, 36)?;
    let image = ImageInput {
        crops: p.num_crops(),
        canvas: [p.image_size.0, p.image_size.1],
        pixel_values: p.pixel_values,
        patch_masks: p.attention_mask,
    };
    Ok((audio, image))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median over rounds of `numerator[i] / denominator[i]`, or null without rounds.
fn median_ratio(numerator: &[f64], denominator: &[f64]) -> Value {
    let mut r: Vec<f64> = numerator
        .iter()
        .zip(denominator)
        .map(|(n, d)| n / d)
        .collect();
    if r.is_empty() {
        Value::Null
    } else {
        json!(median(&mut r))
    }
}

/// Wall time of one call of `f`, in milliseconds.
fn time_ms(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e3
}

/// The encoders' wall times, one per round, in milliseconds.
#[derive(Default)]
struct EncoderTimes {
    host_audio: Vec<f64>,
    iree_audio: Vec<f64>,
    host_vision: Vec<f64>,
    iree_vision: Vec<f64>,
}

impl EncoderTimes {
    /// Each timing as its best round (`host_audio_30s_ms`, ...) and as every round
    /// (`..._rounds`); nothing for a backend that did not run.
    fn record(&self, encoders: &mut Value) {
        for (key, times) in [
            ("host_audio_30s_ms", &self.host_audio),
            ("iree_audio_30s_ms", &self.iree_audio),
            ("host_vision_1344x896_ms", &self.host_vision),
            ("iree_vision_1344x896_ms", &self.iree_vision),
        ] {
            if !times.is_empty() {
                encoders[key] = json!(times.iter().copied().fold(f64::INFINITY, f64::min));
                encoders[format!("{key}_rounds")] = json!(times);
            }
        }
    }
}

/// The mixed batch: base, speech and vision rows interleaved.
/// Positions the IREE decoder is compiled for beyond the prompt and the timed steps: a margin.
/// The host's check of the checkpoint's positions counts them too, so that the decoder never
/// exceeds them.
const EXTRA_POSITIONS: usize = 8;

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

/// What the figures are measured against, in the same run: the FMA peak bounds prefill, the
/// read bandwidth over the weights one step reads bounds a batch-1 decode step.
struct Bounds {
    machine: bounds::MachineBounds,
    /// Useful floating-point work of the prompt's prefill, per prompt token.
    prefill_flops_per_token: f64,
    decode_weight_bytes: usize,
}

impl Bounds {
    fn measure(ck: &Checkpoint, model: &Phi4mm, args: &BenchBatchArgs) -> Bounds {
        let c = &model.config.text;
        Bounds {
            machine: model.install(|| bounds::MachineBounds::measure(args.bandwidth_bytes)),
            prefill_flops_per_token: bounds::prefill_flops(ck, c, args.prompt_tokens)
                / args.prompt_tokens as f64,
            decode_weight_bytes: bounds::DecodeBytes::of(ck, c).total(),
        }
    }

    /// Batch-1 decode tokens/s if every step only streamed its weights at the read bandwidth.
    fn decode_tok_s_bound(&self) -> f64 {
        self.machine.read_bandwidth / self.decode_weight_bytes as f64
    }

    fn json(&self) -> Value {
        let mut j = json!({
            "peak_gflops": self.machine.peak_gflops,
            "peak_vector_path": self.machine.peak_vector_path,
            "read_bandwidth_gb_s": self.machine.read_bandwidth / 1e9,
            "prefill_gflop_per_token": self.prefill_flops_per_token / 1e9,
            "decode_weight_bytes": self.decode_weight_bytes,
            "decode_batch1_bound_tokens_per_s": self.decode_tok_s_bound(),
        });
        self.machine.record_measurements(&mut j);
        j
    }
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
    /// Each figure's best over `rounds` (zero without rounds).
    fn best_of(rounds: &[Figures]) -> Figures {
        rounds.iter().fold(Figures::default(), |b, o| Figures {
            prefill_tok_s: b.prefill_tok_s.max(o.prefill_tok_s),
            b1: b.b1.max(o.b1),
            b8: b.b8.max(o.b8),
            b8_mixed: b.b8_mixed.max(o.b8_mixed),
        })
    }

    fn json(&self, bounds: &Bounds) -> Value {
        let prefill_gflops = self.prefill_tok_s * bounds.prefill_flops_per_token / 1e9;
        json!({
            "prefill_tokens_per_s": self.prefill_tok_s,
            "prefill_gflops": prefill_gflops,
            "prefill_fraction_of_peak": prefill_gflops / bounds.machine.peak_gflops,
            "decode_tokens_per_s_batch1": self.b1,
            "decode_batch1_fraction_of_bandwidth_bound": self.b1 / bounds.decode_tok_s_bound(),
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
    // The IREE decoder takes EXTRA_POSITIONS more than the prompt and steps (below).
    crate::bench::within_context(
        &model.config.text,
        "--prompt-tokens",
        args.prompt_tokens,
        args.new_tokens.saturating_add(EXTRA_POSITIONS),
    )?;
    let ids = crate::bench::prompt_ids(args.prompt_tokens, model.config.text.vocab_size);
    let prompt = model.decoder.embed(&ids);
    let host = HostBackend(model.clone());
    let (iree, modules) = if args.backend != Which::Host {
        let (b, m) = load_iree(&ck, model.clone(), &args)?;
        (Some(b), m)
    } else {
        (None, Value::Null)
    };
    // Before the rounds, so the bounds' own load on the cores is over when they start, and
    // again after them (`MachineBounds`).
    let mut bounds = (!args.encoders_only).then(|| Bounds::measure(&ck, &model, &args));
    // Every round's figures: their best, and the median of the per-round ratios (the backends
    // ran back to back in each round, so a burst of load falls on both, where the best of each
    // backend's rounds may come from different minutes).
    let mut host_rounds = Vec::new();
    let mut iree_rounds = Vec::new();
    // Each round's mixed-vs-base extra time (the two batches ran back to back in that round):
    // their median is the figure the target is about, steadier than best-of on a noisy
    // machine.
    let mut host_mixed_extra = Vec::new();
    let decoder_rounds = if args.encoders_only { 0 } else { args.rounds };
    for _ in 0..decoder_rounds {
        if args.backend != Which::Iree {
            let f =
                model.install(|| one_round(&host, &prompt, args.prompt_tokens, args.new_tokens));
            host_mixed_extra.push(f.b8 / f.b8_mixed - 1.0);
            host_rounds.push(f);
        }
        if let Some(b) = &iree {
            iree_rounds.push(iree_round(b, &prompt, &args));
        }
    }
    let host_best = Figures::best_of(&host_rounds);
    let iree_best = Figures::best_of(&iree_rounds);
    if let Some(b) = &mut bounds {
        model.install(|| b.machine.measure_again(args.bandwidth_bytes));
    }
    // Encoders: a 30 s clip and a 1344×896 image. Host and IREE alternate inside each round, as
    // the decoder's rounds do.
    let (audio, image) = encoder_inputs()?;
    if let Some(b) = &iree {
        iree_encoders_first_call(b, &audio, &image)?;
    }
    let mut times = EncoderTimes::default();
    for _ in 0..args.rounds {
        if args.backend != Which::Iree {
            times.host_audio.push(time_ms(|| {
                model.install(|| {
                    model
                        .audio
                        .encode(&audio.features, audio.frames, AudioBranch::Speech)
                });
            }));
        }
        if let Some(b) = &iree {
            times.iree_audio.push(iree_audio_ms(b, &audio));
        }
        if args.backend != Which::Iree {
            times.host_vision.push(time_ms(|| {
                model.install(|| model.vision.encode(&image));
            }));
        }
        if let Some(b) = &iree {
            times.iree_vision.push(iree_vision_ms(b, &image));
        }
    }
    let mut encoders = json!({
        "audio_frames": audio.frames, "image_crops": image.crops,
        "audio_hidden": model.config.audio.hidden_size,
        "audio_blocks": model.config.audio.num_blocks,
        "vision_hidden": model.config.vision.hidden_size,
        "vision_layers_run": model.config.vision.layers_used(),
    });
    times.record(&mut encoders);
    let c = &model.config.text;
    let mut report = json!({
        "machine": {"cpu": crate::bench::cpu_name(), "host_threads": model.threads(),
                    "load_average": crate::bench::load_average()},
        "kernel_path": switchyard_phi4mm::kernels::path::active().name(),
        "config": {"hidden": c.hidden_size, "layers": c.num_layers, "vocab": c.vocab_size,
                   "speech_lora_r": model.config.speech_lora.map(|l| l.r),
                   "vision_lora_r": model.config.vision_lora.map(|l| l.r)},
        "prompt_tokens": args.prompt_tokens,
        "decode_steps": args.new_tokens,
        "rounds": args.rounds,
    });
    if let Some(b) = &bounds {
        report["bounds"] = b.json();
    }
    if let (Some(b), true) = (&bounds, args.backend != Which::Iree) {
        report["host"] = host_best.json(b);
        report["host"]["mixed_extra_time_median"] = json!(median(&mut host_mixed_extra.clone()));
        report["host"]["mixed_extra_time_rounds"] = json!(host_mixed_extra);
    }
    report["encoders"] = encoders;
    if iree.is_some() {
        if let Some(b) = &bounds {
            report["iree"] = iree_best.json(b);
        }
        report["iree_modules"] = modules;
        if args.backend == Which::Both {
            // Speed, as the rates: above 1 when IREE takes less time.
            let mut ratios = json!({
                "audio_30s": ratio(&report["encoders"], "host_audio_30s_ms", "iree_audio_30s_ms"),
                "vision_1344x896": ratio(
                    &report["encoders"],
                    "host_vision_1344x896_ms",
                    "iree_vision_1344x896_ms",
                ),
            });
            // The same ratios as the median of each round's: the steadier figure where the
            // machine's speed drifts between rounds.
            let mut of_rounds = json!({
                "audio_30s": median_ratio(&times.host_audio, &times.iree_audio),
                "vision_1344x896": median_ratio(&times.host_vision, &times.iree_vision),
            });
            if !args.encoders_only {
                ratios["prefill"] = json!(iree_best.prefill_tok_s / host_best.prefill_tok_s);
                ratios["decode_batch1"] = json!(iree_best.b1 / host_best.b1);
                ratios["decode_batch8"] = json!(iree_best.b8 / host_best.b8);
                let rate = |f: fn(&Figures) -> f64| {
                    let host: Vec<f64> = host_rounds.iter().map(f).collect();
                    let iree: Vec<f64> = iree_rounds.iter().map(f).collect();
                    median_ratio(&iree, &host)
                };
                of_rounds["prefill"] = rate(|f| f.prefill_tok_s);
                of_rounds["decode_batch1"] = rate(|f| f.b1);
                of_rounds["decode_batch8"] = rate(|f| f.b8);
            }
            report["iree_over_host"] = ratios;
            report["iree_over_host_median_of_rounds"] = of_rounds;
        }
    }
    println!("{report}");
    Ok(())
}

/// `e[numerator] / e[denominator]`, or null where either is missing.
fn ratio(e: &serde_json::Value, numerator: &str, denominator: &str) -> serde_json::Value {
    match (e[numerator].as_f64(), e[denominator].as_f64()) {
        (Some(a), Some(b)) => json!(a / b),
        _ => serde_json::Value::Null,
    }
}

#[cfg(feature = "iree")]
type IreeBench = switchyard_phi4mm::iree::backend::IreeBackend;
#[cfg(not(feature = "iree"))]
type IreeBench = ();

/// Loads the IREE backend twice on a fresh artifact cache: the first load compiles every module
/// (cold), the second finds them all in the cache (warm). With `--iree-cache-dir`, on that cache
/// instead (one `phi4mm cache warm` filled, say, on another machine): then the first load
/// compiles only what it lacks. Returns the warm backend and both loads' per-module timings.
#[cfg(feature = "iree")]
fn load_iree(
    ck: &Checkpoint,
    model: Arc<Phi4mm>,
    args: &BenchBatchArgs,
) -> Result<(IreeBench, Value)> {
    let mut s = args.iree.settings();
    // Unless asked for a longer context (to see that it costs a short row nothing), just enough
    // positions for the prompt and the timed steps: fewer cache sizes compile faster.
    let needed = args.prompt_tokens + args.new_tokens + EXTRA_POSITIONS;
    let context = args.iree.iree_context.unwrap_or(needed);
    if context < needed {
        anyhow::bail!(
            "--iree-context {context} is below the {needed} positions the prompt and steps need"
        );
    }
    s.context = Some(context);
    let fresh = tempfile::tempdir_in(std::env::current_dir()?)?;
    if s.cache_dir.is_none() {
        s.cache_dir = Some(fresh.path().to_path_buf());
    }
    let cold = IreeBench::load(ck, model.clone(), &s, crate::compile_progress::terminal())?;
    let cold_modules = cold.details()["modules"].clone();
    drop(cold);
    let warm = IreeBench::load(ck, model, &s, crate::compile_progress::terminal())?;
    let warm_modules = warm.details()["modules"].clone();
    Ok((
        warm,
        json!({"cold": cold_modules, "warm": warm_modules, "decoder_context": context, "prefill_chunk": s.prefill_chunk}),
    ))
}

#[cfg(not(feature = "iree"))]
fn load_iree(_: &Checkpoint, _: Arc<Phi4mm>, _: &BenchBatchArgs) -> Result<(IreeBench, Value)> {
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

/// Runs each IREE encoder once, untimed: its first call loads the module's functions.
#[cfg(feature = "iree")]
fn iree_encoders_first_call(b: &IreeBench, audio: &AudioInput, image: &ImageInput) -> Result<()> {
    let e = b.encoders();
    e.audio
        .encode(&audio.features, audio.frames, AudioBranch::Speech)?;
    e.vision.encode(image)?;
    Ok(())
}

#[cfg(feature = "iree")]
fn iree_audio_ms(b: &IreeBench, audio: &AudioInput) -> f64 {
    time_ms(|| {
        b.encoders()
            .audio
            .encode(&audio.features, audio.frames, AudioBranch::Speech)
            .expect("IREE audio encoder");
    })
}

#[cfg(feature = "iree")]
fn iree_vision_ms(b: &IreeBench, image: &ImageInput) -> f64 {
    time_ms(|| {
        b.encoders()
            .vision
            .encode(image)
            .expect("IREE vision tower");
    })
}

#[cfg(not(feature = "iree"))]
fn iree_encoders_first_call(_: &IreeBench, _: &AudioInput, _: &ImageInput) -> Result<()> {
    unreachable!("load_iree fails without the feature")
}

#[cfg(not(feature = "iree"))]
fn iree_audio_ms(_: &IreeBench, _: &AudioInput) -> f64 {
    unreachable!("load_iree fails without the feature")
}

#[cfg(not(feature = "iree"))]
fn iree_vision_ms(_: &IreeBench, _: &ImageInput) -> f64 {
    unreachable!("load_iree fails without the feature")
}
