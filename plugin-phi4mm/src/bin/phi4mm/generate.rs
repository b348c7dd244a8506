//! `phi4mm generate`: one request through the host backend, greedy, printed as one JSON line
//! `{"tokens": [...], "text": "...", "prompt_tokens": N}`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use switchyard_phi4mm::audio::{features_from_bytes, AudioOptions};
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::{AdapterChoice, AdapterMode, AudioInput, Phi4mm, PromptInput};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Backend {
    Host,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AdapterArg {
    Auto,
    None,
    Speech,
    Vision,
}

#[derive(Args)]
pub struct GenerateArgs {
    /// Checkpoint directory (either layout).
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, value_enum, default_value = "host")]
    pub backend: Backend,
    /// Prompt ids with placeholders already expanded, comma-separated.
    #[arg(long, value_delimiter = ',', num_args = 1.., required = true)]
    pub input_ids: Vec<u32>,
    /// Audio clip (WAV, MP3, FLAC, Ogg); repeat for several, bound to placeholders in order.
    #[arg(long)]
    pub audio: Vec<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    pub adapter: AdapterArg,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Keep generating through end-of-sequence ids.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Write `logits_first` (f32 [vocab], last prompt position) to this safetensors file.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    /// Worker threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// The one JSON line `generate` prints (fields in this order).
#[derive(Serialize)]
struct GenerateOutput {
    tokens: Vec<u32>,
    text: String,
    prompt_tokens: usize,
}

/// Opens a checkpoint with a progress bar over the weight scan (drawn only on a terminal).
pub fn open_checkpoint(dir: &Path) -> Result<Checkpoint> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "loading weights {bar:40} {binary_bytes}/{binary_total_bytes} {msg}",
        )
        .expect("template"),
    );
    let ck = Checkpoint::open_with_progress(dir, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    ck.with_context(|| format!("checkpoint {}", dir.display()))
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let Backend::Host = args.backend;
    let ck = open_checkpoint(&args.model)?;
    let model = Phi4mm::load(&ck, args.threads);
    let adapter = match args.adapter {
        AdapterArg::Auto => AdapterChoice::Auto,
        AdapterArg::None => AdapterChoice::Fixed(AdapterMode::None),
        AdapterArg::Speech => AdapterChoice::Fixed(AdapterMode::Speech),
        AdapterArg::Vision => AdapterChoice::Fixed(AdapterMode::Vision),
    };
    let input = PromptInput {
        input_ids: args.input_ids.clone(),
        images: Vec::new(),
        audios: args
            .audio
            .iter()
            .map(|p| load_audio(p))
            .collect::<Result<_>>()?,
        adapter,
    };
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let prepared = model.prepare(&input, args.max_new_tokens)?;
    let stop: &[u32] = if args.ignore_eos {
        &[]
    } else {
        &model.config.eos_token_ids
    };
    let out = model.generate(&prepared, args.max_new_tokens, stop);
    if let Some(path) = &args.dump_logits {
        write_logits(path, &out.logits_first)?;
    }
    let line = GenerateOutput {
        tokens: out.tokens,
        text: String::new(),
        prompt_tokens: prepared.len,
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}

/// WAV (or other supported format) → log-mel features through the media front end.
fn load_audio(path: &Path) -> Result<AudioInput> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let f = features_from_bytes(&bytes, &AudioOptions::default())
        .with_context(|| format!("audio {}", path.display()))?;
    Ok(AudioInput {
        features: f.features,
        frames: f.frames,
    })
}

fn write_logits(path: &Path, logits: &[f32]) -> Result<()> {
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![logits.len()], &bytes)?;
    safetensors::serialize_to_file([("logits_first", view)], None, path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
