//! `phi4mm bench-vision`: the vision tower with its projector on one 1344×896 image (7 crops), on
//! the host model and (feature `mlx`) on the MLX producer, alternating inside each round so both
//! see the same machine load; one JSON line with best-of-`rounds` times and their ratio. Use a
//! checkpoint from `phi4mm bench-checkpoint --vision-layers N` for real-dimension towers.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::Phi4mm;

use crate::bench::cpu_name;
use crate::bench_batch::encoder_inputs;

#[derive(Args)]
pub struct BenchVisionArgs {
    #[arg(long)]
    model: PathBuf,
    /// Host worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

pub fn run(args: BenchVisionArgs) -> Result<()> {
    let ck = Checkpoint::open(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let model = std::sync::Arc::new(Phi4mm::load(&ck, args.threads));
    let (_, image) = encoder_inputs()?;
    let v = &model.config.vision;

    #[cfg(feature = "mlx")]
    let mlx = {
        let t = Instant::now();
        let host: std::sync::Arc<dyn switchyard_phi4mm::model::MediaEncoders + Send + Sync> =
            model.clone();
        let p = switchyard_phi4mm::mlx::MlxProducer::start(&ck, model.clone(), host)?;
        (p, t.elapsed().as_secs_f64())
    };

    let mut host_ms = f64::INFINITY;
    #[cfg(feature = "mlx")]
    let (mut mlx_ms, mut max_diff) = (f64::INFINITY, 0.0f32);
    for _ in 0..args.rounds.max(1) {
        let t = Instant::now();
        let host = model.install(|| model.vision.encode(&image));
        host_ms = host_ms.min(t.elapsed().as_secs_f64() * 1e3);
        #[cfg(feature = "mlx")]
        {
            let t = Instant::now();
            let got = mlx.0.encode_image(&image)?;
            mlx_ms = mlx_ms.min(t.elapsed().as_secs_f64() * 1e3);
            let diff = switchyard_phi4mm::mlx::qualify::max_abs_diff(&got.embeds, &host.embeds);
            max_diff = max_diff.max(diff);
        }
        std::hint::black_box(&host);
    }
    let report = json!({
        "machine": {"threads": model.threads(), "cpu": cpu_name(), "loadavg": loadavg()},
        "tower": {"hidden": v.hidden_size, "intermediate": v.intermediate_size, "heads": v.num_heads,
                  "layers_run": v.layers_used()},
        "image": {"width": 1344, "height": 896, "crops": image.crops},
        "rounds": args.rounds,
        "host_vision_ms": host_ms,
    });
    #[cfg(feature = "mlx")]
    let report = {
        let mut report = report;
        report["mlx_start_and_qualify_s"] = json!(mlx.1);
        report["mlx_vision_ms"] = json!(mlx_ms);
        report["mlx_over_host_time"] = json!(mlx_ms / host_ms);
        report["mlx_vs_host_max_abs_diff"] = json!(max_diff);
        report
    };
    println!("{report}");
    Ok(())
}

/// `/proc/loadavg`'s three load averages (the machine's load beside the figures).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
