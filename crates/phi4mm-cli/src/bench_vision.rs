//! `phi4mm bench-vision`: the vision tower with its projector on one 1344×896 image (7 crops), on
//! the host model, (feature `mlx`) on the MLX producer and (feature `iree`, with `--iree`) on the
//! IREE vision module, alternating inside each round so all see the same machine load; one JSON
//! line with best-of-`rounds` times, their ratios and each tower's largest difference from the
//! host's rows. Use a checkpoint from `phi4mm bench-checkpoint --vision-layers N` for
//! real-dimension towers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::{ImageEncoding, ImageInput, Phi4mm};

use crate::bench::{cpu_name, load_average};
use crate::bench_batch::encoder_inputs;
use crate::generate::IreeArgs;

#[derive(Args)]
pub struct BenchVisionArgs {
    #[arg(long)]
    model: PathBuf,
    /// Host worker threads (0 = one per core).
    #[arg(long, default_value_t = 0, value_parser = crate::ranges::threads)]
    threads: usize,
    #[arg(long, default_value_t = 3, value_parser = crate::ranges::at_least_one)]
    rounds: usize,
    /// Also time the IREE vision module (a build with the `iree` feature); the first run compiles
    /// it into the artifact cache, outside the timed rounds.
    #[arg(long)]
    iree: bool,
    #[command(flatten)]
    iree_args: IreeArgs,
}

/// Runs one tower on an image.
type RunTower = Box<dyn Fn(&ImageInput) -> Result<ImageEncoding>>;

/// One tower under test: its name, how to run it, and its best time and largest difference from
/// the host's rows so far.
struct Tower {
    name: &'static str,
    run: RunTower,
    best_ms: f64,
    max_diff: f32,
}

pub fn run(args: BenchVisionArgs) -> Result<()> {
    let ck = Checkpoint::open(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let model = Arc::new(Phi4mm::load(&ck, args.threads));
    let (_, image) = encoder_inputs()?;
    let v = &model.config.vision;
    let mut report = json!({
        "machine": {"threads": model.threads(), "cpu": cpu_name(), "load_average": load_average()},
        "tower": {"hidden": v.hidden_size, "intermediate": v.intermediate_size, "heads": v.num_heads,
                  "layers_run": v.layers_used()},
        "image": {"width": 1344, "height": 896, "crops": image.crops},
        "rounds": args.rounds,
    });

    let mut others: Vec<Tower> = Vec::new();
    #[cfg(feature = "mlx")]
    {
        let t = Instant::now();
        let host: Arc<dyn switchyard_phi4mm::model::MediaEncoders + Send + Sync> = model.clone();
        let p = switchyard_phi4mm::mlx::MlxProducer::start(&ck, model.clone(), host)?;
        report["mlx_start_and_qualify_s"] = json!(t.elapsed().as_secs_f64());
        others.push(Tower {
            name: "mlx",
            run: Box::new(move |image| Ok(p.encode_image(image)?)),
            best_ms: f64::INFINITY,
            max_diff: 0.0,
        });
    }
    if args.iree {
        let (tower, load_s) = iree_tower(&ck, &args.iree_args)?;
        report["iree_load_s"] = json!(load_s);
        others.push(tower);
    }

    // One untimed run of each first: one-time allocations and MLX's graph set-up stay out.
    let host_run = || model.install(|| model.vision.encode(&image));
    host_run();
    for o in &others {
        (o.run)(&image)?;
    }
    let mut host_ms = f64::INFINITY;
    for _ in 0..args.rounds.max(1) {
        let t = Instant::now();
        let host = host_run();
        host_ms = host_ms.min(t.elapsed().as_secs_f64() * 1e3);
        for o in &mut others {
            let t = Instant::now();
            let got = (o.run)(&image)?;
            o.best_ms = o.best_ms.min(t.elapsed().as_secs_f64() * 1e3);
            // Not f32::max, which would drop a NaN.
            let d = max_abs_diff(&got.embeds, &host.embeds);
            o.max_diff = if d.is_nan() || d > o.max_diff {
                d
            } else {
                o.max_diff
            };
        }
    }
    report["host_vision_ms"] = json!(host_ms);
    for o in &others {
        report[format!("{}_vision_ms", o.name)] = json!(o.best_ms);
        report[format!("{}_over_host_time", o.name)] = json!(o.best_ms / host_ms);
        report[format!("{}_vs_host_max_abs_diff", o.name)] = json!(o.max_diff);
    }
    report["machine"]["load_average_after"] = json!(load_average());
    println!("{report}");
    Ok(())
}

/// The IREE vision module alone (no decoder or audio compile): the artifact cache and compiler of
/// the IREE options, as the backend would open them. Answers the tower and its load time.
#[cfg(feature = "iree")]
fn iree_tower(ck: &Checkpoint, args: &IreeArgs) -> Result<(Tower, f64)> {
    use switchyard_artifact_cache::ArtifactCache;
    use switchyard_phi4mm::iree::compiler::IreeCompiler;
    use switchyard_phi4mm::iree::context::IreeContext;
    use switchyard_phi4mm::iree::vision::IreeVision;

    let s = args.settings();
    let dir = s
        .cache_dir
        .clone()
        .unwrap_or_else(ArtifactCache::default_dir);
    let cache = ArtifactCache::open(&dir)
        .with_context(|| format!("opening the artifact cache {}", dir.display()))?;
    let compiler = IreeCompiler::for_target(s.compiler.as_deref(), s.compile_target())?;
    let ctx = IreeContext::new(Arc::new(cache), compiler, &s.device)?;
    let t = Instant::now();
    let vision = IreeVision::load(ck, &ctx)?;
    let load_s = t.elapsed().as_secs_f64();
    let tower = Tower {
        name: "iree",
        run: Box::new(move |image| Ok(vision.encode(image)?)),
        best_ms: f64::INFINITY,
        max_diff: 0.0,
    };
    Ok((tower, load_s))
}

#[cfg(not(feature = "iree"))]
fn iree_tower(_: &Checkpoint, _: &IreeArgs) -> Result<(Tower, f64)> {
    anyhow::bail!("--iree: this phi4mm was built without the `iree` feature")
}

/// Largest `|a - b|`; NaN when any pair holds one (a NaN must not read as agreement).
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::NAN;
    }
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(d)
        }
    })
}
