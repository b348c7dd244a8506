//! `phi4mm bench-frontend`: the front end's own timings, as one JSON line.
//!
//! Four measurements on the inputs of [`inputs`], interleaved round by round (so a load change on
//! a shared machine hits all four alike), each reported as the median over the rounds:
//! `logmel_30s_16k_wav_ms` and `logmel_30s_44k_wav_ms` (WAV bytes → features, the 44.1 kHz clip
//! through the polyphase resampler), `image_1344x896_png_ms` (PNG bytes → crops) and
//! `image_1344x896_rgb_ms` (decoded pixels → crops). The work runs in a pool of `--threads`
//! threads, the thread count `scripts/bench-vs-transformers/frontend.py` gives PyTorch.

pub mod inputs;

use anyhow::{Context, Result};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;
use switchyard_phi4mm_frontend::audio::{self, AudioOptions};
use switchyard_phi4mm_frontend::image::{self as frontend_image, ImageOptions};

#[derive(clap::Args)]
pub struct BenchFrontendArgs {
    /// Threads of the pool the front end runs in (PyTorch's `torch.set_num_threads` on the
    /// reference side).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed rounds (each runs all four measurements once); medians are reported.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Also write the inputs here (`speech_30s_16k.wav`, `speech_30s_44k.wav`,
    /// `photo_1344x896.png`) for the Python reference to read.
    #[arg(long)]
    write_inputs: Option<PathBuf>,
}

/// File names of the inputs in `--write-inputs`, as the Python side reads them.
const WAV_16K: &str = "speech_30s_16k.wav";
const WAV_44K: &str = "speech_30s_44k.wav";
const PNG: &str = "photo_1344x896.png";

pub fn run(args: BenchFrontendArgs) -> Result<()> {
    anyhow::ensure!(args.threads >= 1, "--threads must be at least 1");
    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let wav16 = inputs::speech_like_wav(16_000);
    let wav44 = inputs::speech_like_wav(44_100);
    let png = inputs::photo_like_png();
    if let Some(dir) = &args.write_inputs {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, bytes) in [(WAV_16K, &wav16), (WAV_44K, &wav44), (PNG, &png)] {
            let path = dir.join(name);
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .context("building the thread pool")?;
    let audio_options = AudioOptions::default();
    let image_options = ImageOptions::default();
    let rgb = frontend_image::decode::decode_rgb(&png, &image_options)?;
    let logmel = |wav: &[u8]| {
        audio::features_from_bytes(wav, &audio_options).map(|f| f.frames * audio::N_MELS)
    };
    let from_png = || frontend_image::preprocess(&png, &image_options).map(|p| p.num_img_tokens);
    let from_rgb = || frontend_image::preprocess_rgb(&rgb, image_options.max_crops);
    // One untimed round: the mel bank, FFT plans and the pool's threads are set up once per
    // process, as in a server.
    pool.install(|| -> Result<()> {
        logmel(&wav16)?;
        logmel(&wav44)?;
        from_png()?;
        from_rgb()?;
        Ok(())
    })?;
    let mut times: [Vec<f64>; 4] = Default::default();
    for _ in 0..args.rounds {
        pool.install(|| -> Result<()> {
            times[0].push(timed(|| logmel(&wav16))?);
            times[1].push(timed(|| logmel(&wav44))?);
            times[2].push(timed(from_png)?);
            times[3].push(timed(from_rgb)?);
            Ok(())
        })?;
    }
    let [m16, m44, mpng, mrgb] = times.map(median);
    let report = json!({
        "logmel_30s_16k_wav_ms": m16,
        "logmel_30s_44k_wav_ms": m44,
        "image_1344x896_png_ms": mpng,
        "image_1344x896_rgb_ms": mrgb,
        "threads": args.threads,
        "rounds": args.rounds,
        "cpu": crate::bench::cpu_name(),
        "load_average": crate::bench::load_average(),
        "inputs": {"wav_16k_bytes": wav16.len(), "wav_44k_bytes": wav44.len(), "png_bytes": png.len()},
    });
    println!("{report}");
    Ok(())
}

/// Milliseconds one call of `f` takes (its result is checked, then dropped outside the timing).
fn timed<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<f64>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let start = Instant::now();
    let out = f()?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    drop(out);
    Ok(ms)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}
