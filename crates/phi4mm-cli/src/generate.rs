//! `phi4mm generate`: one request through the host or IREE backend (with the host or MLX producer
//! of embeddings and image rows), greedy, printed as one JSON line
//! `{"tokens": [...], "text": "...", "prompt_tokens": N}`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use switchyard_phi4mm::adapter::AdapterChoice;
use switchyard_phi4mm::backend;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::config::{BackendKind, IreeSettings, ProducerKind};
use switchyard_phi4mm::model::{HostBackend, MediaEncoders, MergedPrompt, Phi4mm, PromptInput};
use switchyard_phi4mm::request;
use switchyard_phi4mm::step::{greedy, GreedyOutput};
#[cfg(feature = "iree")]
use switchyard_phi4mm::{iree::backend::IreeBackend, model::InputError};
use switchyard_phi4mm_frontend::prompt::{ContentPart, Message, Prompt, Role};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Backend {
    Host,
    Iree,
    Auto,
}

/// Who produces the token embeddings and image rows (`producer` in the plugin settings).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Producer {
    Host,
    Mlx,
}

impl Producer {
    pub fn kind(self) -> ProducerKind {
        match self {
            Producer::Host => ProducerKind::Host,
            Producer::Mlx => ProducerKind::Mlx,
        }
    }
}

/// IREE backend options shared by `generate` and `batch`.
#[derive(Args, Clone, Debug)]
pub struct IreeArgs {
    /// Artifact cache directory (default `$XDG_CACHE_HOME/switchyard/iree`; `bench-batch`: a fresh
    /// one, so that it measures the cold compiles too).
    #[arg(long)]
    pub iree_cache_dir: Option<PathBuf>,
    /// Longest row the IREE decoder is compiled for (default: the checkpoint's
    /// `max_position_embeddings`; `bench-batch`: just what its prompt and steps need).
    #[arg(long, value_parser = crate::ranges::at_least_one)]
    pub iree_context: Option<usize>,
    /// Prompt tokens per compiled IREE prefill call (default: the plugin's, 64).
    #[arg(long, value_parser = crate::ranges::at_least_one)]
    pub iree_prefill_chunk: Option<usize>,
    /// IREE HAL driver: `local-task` (every core), `local-sync` (one thread), `cuda`.
    #[arg(long, default_value = "local-task")]
    pub iree_device: String,
    /// NVPTX architecture the modules are compiled for with `--iree-device cuda` (default: the
    /// plugin's, `sm_80`, which runs on Ampere and every later GPU).
    #[arg(long)]
    pub iree_cuda_target: Option<String>,
    /// Longest one module's compile may run before it is killed (default: the plugin's
    /// `iree.compile_timeout_secs`, 3600).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub iree_compile_timeout_secs: Option<u64>,
}

impl IreeArgs {
    pub fn settings(&self) -> IreeSettings {
        IreeSettings {
            cache_dir: self.iree_cache_dir.clone(),
            context: self.iree_context,
            prefill_chunk: self
                .iree_prefill_chunk
                .unwrap_or_else(|| IreeSettings::default().prefill_chunk),
            device: self.iree_device.clone(),
            cuda_target: self
                .iree_cuda_target
                .clone()
                .unwrap_or_else(|| IreeSettings::default().cuda_target),
            compile_timeout_secs: self
                .iree_compile_timeout_secs
                .unwrap_or_else(|| IreeSettings::default().compile_timeout_secs),
            ..IreeSettings::default()
        }
    }
}

impl Backend {
    pub fn kind(self) -> BackendKind {
        match self {
            Backend::Host => BackendKind::Host,
            Backend::Iree => BackendKind::Iree,
            Backend::Auto => BackendKind::Auto,
        }
    }
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).multiple(false)))]
pub struct GenerateArgs {
    /// Checkpoint directory (either layout).
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, value_enum, default_value = "host")]
    pub backend: Backend,
    /// `mlx`: MLX embeds the ids and runs the vision tower (a build with the `mlx` feature).
    #[arg(long, value_enum, default_value = "host")]
    pub producer: Producer,
    /// Prompt ids with placeholders already expanded (one id per media row), comma-separated;
    /// with media, their placeholders must match the media's rows (without, a placeholder id is
    /// an ordinary token, as in the reference).
    #[arg(long, value_delimiter = ',', num_args = 1.., group = "input")]
    pub input_ids: Vec<u32>,
    /// One user message, rendered with the chat template and the generation prompt;
    /// `<|image_N|>` / `<|audio_N|>` mark where the media go (else they lead the message).
    #[arg(long, group = "input")]
    pub prompt: Option<String>,
    /// JSON file of OpenAI-style messages (`[{"role": ..., "content": ...}]`), rendered with the
    /// chat template and the generation prompt.
    #[arg(long, group = "input")]
    pub messages: Option<PathBuf>,
    /// Audio clip (WAV, MP3, FLAC, Ogg); repeat for several, bound to placeholders in order.
    #[arg(long)]
    pub audio: Vec<PathBuf>,
    /// Image (PNG, JPEG, WebP, GIF); repeat for several, bound to placeholders in order.
    #[arg(long)]
    pub image: Vec<PathBuf>,
    #[arg(long, default_value = "auto", value_parser = adapter_parser())]
    pub adapter: AdapterChoice,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Keep generating through end-of-sequence ids.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Write `logits_first` (`f32 [vocab]`, last prompt position) to this safetensors file.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    /// Worker threads (0 = one per core).
    #[arg(long, default_value_t = 0, value_parser = crate::ranges::threads)]
    pub threads: usize,
    #[command(flatten)]
    pub iree: IreeArgs,
}

/// `--adapter auto|none|speech|vision`, listed in `--help` and in the error for any other value
/// as a `ValueEnum` would be.
fn adapter_parser() -> impl clap::builder::TypedValueParser<Value = AdapterChoice> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(AdapterChoice::NAMES)
        .map(|name| name.parse().expect("a listed name parses"))
}

/// The one JSON line `generate` prints (fields in this order).
#[derive(Serialize)]
struct GenerateOutput {
    tokens: Vec<u32>,
    /// Left out for a checkpoint without `tokenizer.json` (see `batch`'s line).
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    prompt_tokens: usize,
}

/// Opens a checkpoint and loads the model from it, with a progress bar over the weight scan and
/// a spinner while the kernels' weights are prepared (drawn only on a terminal).
pub fn load_model(dir: &Path, threads: usize) -> Result<(Checkpoint, Arc<Phi4mm>)> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "loading weights {bar:40} {binary_bytes}/{binary_total_bytes} {msg}",
        )
        .expect("template"),
    );
    // The scan runs on every core, and the threads report the shared running total each after
    // its own tensor, so a smaller total can arrive after a larger one: the bar only moves
    // forward (under a lock, for two moves must not land in the other order either).
    let shown = std::sync::Mutex::new(0u64);
    let ck = Checkpoint::open_with_progress(dir, &|done, total| {
        let mut shown = shown.lock().unwrap();
        if done > *shown {
            *shown = done;
            bar.set_length(total);
            bar.set_position(done);
        }
    });
    let ck = match ck {
        Ok(ck) => ck,
        Err(e) => {
            bar.finish_and_clear();
            return Err(e).with_context(|| format!("checkpoint {}", dir.display()));
        }
    };
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("template"));
    bar.set_message("preparing the weights for the kernels");
    bar.reset_elapsed();
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let model = Arc::new(Phi4mm::load(&ck, threads));
    bar.finish_and_clear();
    Ok((ck, model))
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let (ck, model) = load_model(&args.model, args.threads)?;
    let adapter = args.adapter;
    let read = |paths: &[PathBuf]| -> Result<Vec<Vec<u8>>> {
        paths
            .iter()
            .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
            .collect()
    };
    let (image_bytes, audio_bytes) = (read(&args.image)?, read(&args.audio)?);
    let media = request::MediaOptions::default();
    // The tokenizer is needed for text prompts and to decode the output; a checkpoint without one
    // (e.g. the benchmark's) still runs from ids.
    let tokenizer = if args.model.join("tokenizer.json").exists() {
        Some(Prompt::load(&args.model)?)
    } else {
        None
    };
    let input = if !args.input_ids.is_empty() {
        let imgs: Vec<&[u8]> = image_bytes.iter().map(Vec::as_slice).collect();
        let auds: Vec<&[u8]> = audio_bytes.iter().map(Vec::as_slice).collect();
        request::from_ids(args.input_ids.clone(), &imgs, &auds, &media, adapter)
            .map_err(|e| name_media_file(e, true, &args.image, &args.audio))?
    } else {
        let prompt = tokenizer
            .as_ref()
            .with_context(|| format!("{} has no tokenizer.json", args.model.display()))?;
        let mut messages: Vec<Message> = match (&args.prompt, &args.messages) {
            (Some(text), _) => vec![Message::text(Role::User, text.clone())],
            (None, Some(path)) => {
                let bytes =
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                serde_json::from_slice(&bytes)
                    .with_context(|| format!("parsing messages in {}", path.display()))?
            }
            (None, None) => unreachable!("clap requires one input"),
        };
        let files_only = attach_media(&mut messages, image_bytes, audio_bytes)?;
        request::from_messages(&model, prompt, &messages, &media, adapter)
            .map_err(|e| name_media_file(e, files_only, &args.image, &args.audio))?
    };
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let stop: Vec<u32> = if args.ignore_eos {
        Vec::new()
    } else {
        model.config.eos_token_ids.clone()
    };
    let iree = args.iree.settings();
    let producer = args.producer.kind();
    let (prepared, out) = match backend::resolve(args.backend.kind(), &iree)? {
        BackendKind::Iree => {
            let n = args.max_new_tokens;
            iree_generate(&ck, model, &iree, producer, &input, n, &stop)?
        }
        _ => {
            let host: Arc<dyn MediaEncoders + Send + Sync> = model.clone();
            let (encoders, _) = backend::producer_encoders(producer, &ck, &model, host)?;
            let context = model.config.text.max_position_embeddings;
            let prepared = model
                .install(|| model.prepare_with(&input, args.max_new_tokens, &*encoders, context))?;
            let out = greedy(
                &HostBackend(model),
                &prepared.embeds,
                prepared.adapter,
                args.max_new_tokens,
                &stop,
            );
            (prepared, out)
        }
    };
    if let Some(path) = &args.dump_logits {
        write_logits(path, &out.logits_first)?;
    }
    let text = tokenizer
        .as_ref()
        .map(|p| p.tokenizer().decode(&out.tokens, true))
        .transpose()
        .map_err(|e| anyhow::anyhow!("decoding the output: {e}"))?;
    let line = GenerateOutput {
        tokens: out.tokens,
        text,
        prompt_tokens: prepared.len,
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}

/// The media stage and greedy decoding on the IREE backend.
#[cfg(feature = "iree")]
fn iree_generate(
    ck: &Checkpoint,
    model: Arc<Phi4mm>,
    settings: &IreeSettings,
    producer: ProducerKind,
    input: &PromptInput,
    max_new_tokens: usize,
    stop: &[u32],
) -> Result<(MergedPrompt, GreedyOutput)> {
    // The request is checked against the decoder it would get before that decoder compiles:
    // on the released model a cold compile takes minutes.
    let positions = switchyard_phi4mm::iree::backend::decoder_positions(ck, settings);
    match model.validate_input_within(input, max_new_tokens, positions) {
        Err(InputError::ContextOverflow { .. }) => bail!(
            "prompt of {} tokens + {max_new_tokens} new tokens exceeds the {positions} positions \
             of the IREE decoder (--iree-context, default the checkpoint's \
             max_position_embeddings); nothing was compiled",
            input.input_ids.len()
        ),
        checked => checked?,
    }
    let iree = IreeBackend::load(
        ck,
        model.clone(),
        settings,
        crate::compile_progress::terminal(),
    )?;
    let own = iree.media_stage().encoders();
    let (encoders, _) = backend::producer_encoders(producer, ck, &model, own)?;
    let prepared = model.prepare_with(input, max_new_tokens, &*encoders, iree.context())?;
    let out = greedy(
        &iree,
        &prepared.embeds,
        prepared.adapter,
        max_new_tokens,
        stop,
    );
    Ok((prepared, out))
}

#[cfg(not(feature = "iree"))]
fn iree_generate(
    _: &Checkpoint,
    _: Arc<Phi4mm>,
    _: &IreeSettings,
    _: ProducerKind,
    _: &PromptInput,
    _: usize,
    _: &[u32],
) -> Result<(MergedPrompt, GreedyOutput)> {
    unreachable!("backend::resolve refuses iree without the feature")
}

/// Appends the `--image` / `--audio` files to the last user message as media parts (images
/// first), where the chat template binds them to placeholders in order of appearance. Returns
/// whether the files are all the media there are: then a medium's index in an error is the
/// index of its file.
pub fn attach_media(
    messages: &mut [Message],
    images: Vec<Vec<u8>>,
    audios: Vec<Vec<u8>>,
) -> Result<bool> {
    let files_only = !messages
        .iter()
        .flat_map(|m| &m.content)
        .any(|part| matches!(part, ContentPart::Image { .. } | ContentPart::Audio { .. }));
    if images.is_empty() && audios.is_empty() {
        return Ok(files_only);
    }
    let Some(last_user) = messages.iter_mut().rev().find(|m| m.role == Role::User) else {
        bail!("--image / --audio need a user message to attach to");
    };
    last_user
        .content
        .extend(images.into_iter().map(|bytes| ContentPart::Image { bytes }));
    last_user
        .content
        .extend(audios.into_iter().map(|bytes| ContentPart::Audio { bytes }));
    Ok(files_only)
}

/// An error about the request's `image i` or `audio i`, led by the file it was read from when
/// the files are all its media (`files_only`): the model counts media, the user named files.
pub fn name_media_file(
    e: request::RequestError,
    files_only: bool,
    images: &[PathBuf],
    audios: &[PathBuf],
) -> anyhow::Error {
    let file = match &e {
        _ if !files_only => None,
        request::RequestError::Image { index, .. } => images.get(*index),
        request::RequestError::Audio { index, .. } => audios.get(*index),
        _ => None,
    };
    match file {
        Some(path) => anyhow::anyhow!("{}: {e}", path.display()),
        None => e.into(),
    }
}

fn write_logits(path: &Path, logits: &[f32]) -> Result<()> {
    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![logits.len()], &bytes)?;
    // As in `tensors_out`: the error's text already holds its cause.
    safetensors::serialize_to_file([("logits_first", view)], None, path)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    Ok(())
}
