//! `phi4mm batch`: every request of a JSON file at once through the real scheduler; one JSON
//! line per request, in file order: `{"tokens": [...], "text": "...", "prompt_tokens": N}`.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use switchyard_phi4mm::adapter::AdapterChoice;
use switchyard_phi4mm::backend::{self, BackendChoice};
use switchyard_phi4mm::request;
use switchyard_phi4mm::sampling::Logprobs;
use switchyard_phi4mm::scheduler::{GenerationParams, Job, Outcome, RowSink, SchedulerConfig};
use switchyard_phi4mm_frontend::prompt::{Message, Prompt, Role};

use crate::generate::{attach_media, load_model, name_media_file, Backend, IreeArgs, Producer};

#[derive(Args)]
pub struct BatchArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, value_enum, default_value = "host")]
    pub backend: Backend,
    /// `mlx`: MLX embeds the ids and runs the vision tower (a build with the `mlx` feature).
    #[arg(long, value_enum, default_value = "host")]
    pub producer: Producer,
    /// JSON array of requests (fields of `generate`).
    #[arg(long)]
    pub requests: PathBuf,
    /// Scheduler slots (default: one per request, at most 1024; more requests wait for a slot).
    #[arg(long, value_parser = crate::ranges::slots)]
    pub slots: Option<usize>,
    #[arg(long, default_value_t = 0, value_parser = crate::ranges::threads)]
    pub threads: usize,
    #[command(flatten)]
    pub iree: IreeArgs,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestSpec {
    input_ids: Option<Vec<u32>>,
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    #[serde(default)]
    audio: Vec<PathBuf>,
    #[serde(default)]
    image: Vec<PathBuf>,
    /// `auto` (default), `none`, `speech` or `vision`.
    #[serde(default)]
    adapter: AdapterChoice,
    #[serde(default = "default_max")]
    max_new_tokens: usize,
    #[serde(default)]
    ignore_eos: bool,
    /// Report each token's log probability and this many best alternatives.
    #[serde(default)]
    logprobs: Option<usize>,
}

/// The `--requests` file: a JSON array, each element parsed on its own so that an error names
/// its request (serde's own message for a whole file given as an object is "invalid type: map").
fn read_specs(path: &Path) -> Result<Vec<RequestSpec>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let items: Vec<&serde_json::value::RawValue> =
        serde_json::from_slice(&bytes).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => anyhow::anyhow!(
                "{}: must be a JSON array of requests, like [{{\"prompt\": \"Hello\"}}]",
                path.display()
            ),
            _ => anyhow::anyhow!("{}: not valid JSON: {e}", path.display()),
        })?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            // Positions in the error count from the start of this request.
            serde_json::from_str(item.get())
                .with_context(|| format!("{}: request {i}", path.display()))
        })
        .collect()
}

fn default_max() -> usize {
    64
}

#[derive(Serialize)]
struct Line {
    tokens: Vec<u32>,
    /// Left out for a checkpoint without `tokenizer.json`: nothing decodes the tokens, and an
    /// empty text would read as an empty answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    prompt_tokens: usize,
    /// With `logprobs`: per token, its log probability and the best alternatives.
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Vec<TokenLine>>,
}

#[derive(Serialize)]
struct TokenLine {
    logprob: f32,
    /// `[id, logprob]`, best first.
    top: Vec<(u32, f32)>,
}

/// What one request produced.
#[derive(Default)]
struct Produced {
    tokens: Vec<u32>,
    logprobs: Option<Vec<TokenLine>>,
}

struct Collect {
    index: usize,
    produced: Produced,
    tx: Sender<(usize, Produced, Outcome)>,
}

impl RowSink for Collect {
    fn started(&mut self, _: usize) -> bool {
        true
    }
    fn token(&mut self, id: u32, _: &str, logprobs: Option<&Logprobs>) -> bool {
        self.produced.tokens.push(id);
        if let Some(l) = logprobs {
            self.produced
                .logprobs
                .get_or_insert_with(Vec::new)
                .push(TokenLine {
                    logprob: l.sampled.1,
                    top: l.top.clone(),
                });
        }
        true
    }
    fn done(&mut self, outcome: Outcome) {
        let _ = self
            .tx
            .send((self.index, std::mem::take(&mut self.produced), outcome));
    }
}

pub fn run(args: BatchArgs) -> Result<()> {
    let specs = read_specs(&args.requests)?;
    let (ck, model) = load_model(&args.model, args.threads)?;
    let prompt = if args.model.join("tokenizer.json").exists() {
        Some(Prompt::load(&args.model)?)
    } else {
        None
    };
    let media_options = request::MediaOptions::default();
    let iree = args.iree.settings();
    let running = backend::start(
        BackendChoice {
            kind: args.backend.kind(),
            producer: args.producer.kind(),
            iree: &iree,
            compiles: crate::compile_progress::terminal(),
        },
        &ck,
        model.clone(),
        SchedulerConfig {
            slots: args
                .slots
                .unwrap_or(specs.len().clamp(1, switchyard_phi4mm::config::MAX_SLOTS)),
            max_queued: specs.len(),
            max_queued_tokens: usize::MAX,
            ..SchedulerConfig::default()
        },
        None,
    )?;
    let (sched, media) = (running.scheduler, running.media);
    let (tx, rx) = channel();
    let mut prompt_tokens = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let adapter = spec.adapter;
        let read = |paths: &[PathBuf]| -> Result<Vec<Vec<u8>>> {
            paths
                .iter()
                .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
                .collect()
        };
        // Every error of a request names it (and the file of a medium that does not read).
        let input = (|| -> Result<_> {
            let given = [
                spec.input_ids.is_some(),
                spec.prompt.is_some(),
                spec.messages.is_some(),
            ];
            if given.iter().filter(|g| **g).count() != 1 {
                bail!("give exactly one of input_ids, prompt or messages");
            }
            if spec.max_new_tokens == 0 {
                bail!("max_new_tokens must be at least 1");
            }
            let (images, audios) = (read(&spec.image)?, read(&spec.audio)?);
            if let Some(ids) = &spec.input_ids {
                let im: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
                let au: Vec<&[u8]> = audios.iter().map(Vec::as_slice).collect();
                return request::from_ids(ids.clone(), &im, &au, &media_options, adapter)
                    .map_err(|e| name_media_file(e, true, &spec.image, &spec.audio));
            }
            let p = prompt
                .as_ref()
                .context("the checkpoint has no tokenizer.json")?;
            let mut messages = match (&spec.prompt, &spec.messages) {
                (Some(text), _) => vec![Message::text(Role::User, text.clone())],
                (_, messages) => messages.clone().unwrap_or_default(),
            };
            let files_only = attach_media(&mut messages, images, audios)?;
            request::from_messages(&model, p, &messages, &media_options, adapter)
                .map_err(|e| name_media_file(e, files_only, &spec.image, &spec.audio))
        })()
        .with_context(|| format!("request {i}"))?;
        prompt_tokens.push(input.input_ids.len());
        let job = Job {
            id: i as u64,
            prompt_tokens: input.input_ids.len(),
            prepare: media.prepare_fn(input, spec.max_new_tokens),
            generation: GenerationParams {
                stop_ids: if spec.ignore_eos {
                    Vec::new()
                } else {
                    model.config.eos_token_ids.clone()
                },
                logprobs: spec.logprobs,
                ..GenerationParams::greedy(spec.max_new_tokens)
            },
            sink: Box::new(Collect {
                index: i,
                produced: Produced::default(),
                tx: tx.clone(),
            }),
        };
        sched
            .submit(job)
            .map_err(|r| anyhow::anyhow!("request {i} refused: {r}"))?;
    }
    let mut results: Vec<Option<Produced>> = (0..specs.len()).map(|_| None).collect();
    for _ in 0..specs.len() {
        let (i, produced, outcome) = rx.recv()?;
        if let Outcome::Failed(e) = outcome {
            bail!("request {i} failed: {e}");
        }
        results[i] = Some(produced);
    }
    sched.shutdown();
    for (produced, prompt_tokens) in results.into_iter().zip(prompt_tokens) {
        let Produced { tokens, logprobs } = produced.expect("every request reported");
        let text = prompt
            .as_ref()
            .map(|p| p.tokenizer().decode(&tokens, true))
            .transpose()
            .map_err(|e| anyhow::anyhow!("decoding the output: {e}"))?;
        let line = Line {
            tokens,
            text,
            prompt_tokens,
            logprobs,
        };
        println!("{}", serde_json::to_string(&line)?);
    }
    Ok(())
}
