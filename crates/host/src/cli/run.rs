//! `switchyard run`: one request from the command line, its answer streamed to the terminal.

use crate::{
    config,
    runtime::Runtime,
    server::event_stream::{EventStream, Step},
};
use abi_stable::std_types::{ROption, RVec};
use anyhow::Context as _;
use futures_util::StreamExt;
use std::{io::Write, path::PathBuf, process::ExitCode, sync::Arc};
use switchyard_plugin_api::{Endpoint, Message, Part, Request, Role, SamplingParams};

#[derive(clap::Args)]
pub struct RunArgs {
    #[arg(long)]
    config: PathBuf,
    /// Requested model name (a route or an instance name).
    #[arg(long)]
    model: String,
    #[arg(long, default_value = "")]
    prompt: String,
    #[arg(long)]
    image: Vec<PathBuf>,
    #[arg(long)]
    audio: Vec<PathBuf>,
    #[arg(long)]
    max_tokens: Option<u32>,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let RunArgs {
        config: path,
        model,
        prompt,
        image: images,
        audio: audios,
        max_tokens,
        temperature,
    } = args;
    let config = config::load(&path)?;
    let read = |file: &std::path::Path| {
        std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))
    };
    let mut parts = Vec::new();
    for image in &images {
        parts.push(Part::Image(RVec::from(read(image)?)));
    }
    for audio in &audios {
        let format = audio
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or_default()
            .to_string();
        parts.push(Part::Audio {
            data: RVec::from(read(audio)?),
            format: format.into(),
        });
    }
    if !prompt.is_empty() {
        parts.push(Part::Text(prompt.into()));
    }
    let request = Request {
        sampling: SamplingParams {
            max_tokens: max_tokens.map_or(ROption::RNone, ROption::RSome),
            temperature,
            ..SamplingParams::default()
        },
        ..Request::new(
            1,
            Endpoint::Chat,
            vec![Message {
                role: Role::User,
                parts: parts.into(),
            }],
        )
    };
    // Create only what this request can reach: the models of its routes (and fallbacks).
    let config = config.reachable_from(&model);
    let runtime = Runtime::for_config(&path, &config)?;
    let rt = tokio::runtime::Runtime::new()?;
    super::block_on_then_leave_behind(rt, async move {
        let answered = answer(&runtime, config, &model, request).await;
        // However it ended: the instances stop, and this process's plugin copies go.
        runtime.shutdown(std::time::Duration::from_secs(5)).await;
        answered
    })
}

/// Creates what serves `model`, sends it `request` and writes the answer as it streams.
async fn answer(
    runtime: &Arc<Runtime>,
    config: config::ValidConfig,
    model: &str,
    request: Request,
) -> anyhow::Result<ExitCode> {
    let modality = request.modality();
    runtime.apply(config).await?;
    let deployment = runtime.current();
    let candidates = deployment
        .table
        .resolve(model, modality, &Default::default())?;
    let instance = candidates.first().clone();
    let started = std::time::Instant::now();
    let events = EventStream::open(&instance, request, &runtime.metrics, model, started)
        .map_err(|r| anyhow::anyhow!("{} refused the request: {r}", instance.name))?;
    let mut steps = std::pin::pin!(events.into_steps());
    let mut stdout = std::io::stdout();
    let mut code = ExitCode::SUCCESS;
    while let Some(step) = steps.next().await {
        match step {
            Step::Token { text, .. } => {
                write!(stdout, "{text}")?;
                stdout.flush()?;
            }
            Step::Finished { reason, usage } => {
                writeln!(stdout)?;
                eprintln!(
                    "[{} via {}: {} prompt + {} completion tokens, finish: {}]",
                    instance.name,
                    instance.plugin_label(),
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    reason.as_openai()
                );
            }
            Step::Failed(failure) => {
                eprintln!("\nerror: {failure}");
                code = ExitCode::FAILURE;
            }
        }
    }
    Ok(code)
}
