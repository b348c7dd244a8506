//! The `switchyard` command line.

use crate::{
    config, registry,
    runtime::Runtime,
    server::{
        self,
        event_stream::{EventStream, Step},
    },
};
use abi_stable::std_types::{ROption, RVec};
use clap::{Parser, Subcommand};
use futures_util::StreamExt;
use std::{io::Write, net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc};
use switchyard_plugin_api::{Endpoint, Message, Part, Request, Role, SamplingParams};

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "An inference router that many model plugins share"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API from a config file.
    Serve {
        #[arg(long)]
        config: PathBuf,
        /// Overrides server.listen.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Overrides server.admin_listen (must be loopback).
        #[arg(long)]
        admin_listen: Option<SocketAddr>,
    },
    /// Send one request to a model from the command line and stream the answer.
    Run {
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
    },
    /// Plugin files.
    Plugins {
        #[command(subcommand)]
        command: PluginsCommand,
    },
    /// Config files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum PluginsCommand {
    /// Describe a plugin file (any build, even an incompatible one) and check it against this host.
    Inspect { file: PathBuf },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a config file, including its plugin files and pins, without serving.
    Check { file: PathBuf },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Serve {
            config,
            listen,
            admin_listen,
        } => serve(config, listen, admin_listen),
        Command::Run {
            config,
            model,
            prompt,
            image,
            audio,
            max_tokens,
            temperature,
        } => run(config, model, prompt, image, audio, max_tokens, temperature),
        Command::Plugins {
            command: PluginsCommand::Inspect { file },
        } => inspect(file),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => check(file),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime_for(path: &std::path::Path) -> anyhow::Result<(Arc<Runtime>, config::ValidConfig)> {
    let config = config::load(path)?;
    let cache_dir = config
        .server
        .cache_dir
        .clone()
        .unwrap_or_else(config::default_cache_dir);
    let runtime = Runtime::new(Some(path.to_path_buf()), cache_dir)?;
    Ok((runtime, config))
}

fn serve(
    path: PathBuf,
    listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
) -> anyhow::Result<ExitCode> {
    let (runtime, config) = runtime_for(&path)?;
    let listen = listen.unwrap_or(config.server.listen.parse()?);
    let admin = match admin_listen {
        Some(a) if !a.ip().is_loopback() => {
            anyhow::bail!("--admin-listen {a} is not a loopback address")
        }
        Some(a) => Some(a),
        None => config
            .server
            .admin_listen
            .as_deref()
            .map(str::parse)
            .transpose()?,
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        runtime.apply(config).await?;
        server::serve(runtime, listen, admin).await
    })?;
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::too_many_arguments)]
fn run(
    path: PathBuf,
    model: String,
    prompt: String,
    images: Vec<PathBuf>,
    audios: Vec<PathBuf>,
    max_tokens: Option<u32>,
    temperature: f32,
) -> anyhow::Result<ExitCode> {
    let (runtime, mut config) = runtime_for(&path)?;
    let mut parts = Vec::new();
    for image in &images {
        parts.push(Part::Image(RVec::from(std::fs::read(image)?)));
    }
    for audio in &audios {
        let format = audio
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or_default()
            .to_string();
        parts.push(Part::Audio {
            data: RVec::from(std::fs::read(audio)?),
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
    let modality = request.modality();
    let wanted: Vec<String> = config
        .routes
        .iter()
        .filter(|r| r.models.contains(&model))
        .flat_map(|r| {
            r.backends
                .iter()
                .map(|b| b.model.clone())
                .chain(r.fallbacks.iter().cloned())
        })
        .chain(std::iter::once(model.clone()))
        .collect();
    config.config.models.retain(|m| wanted.contains(&m.name));
    config.config.routes.retain(|r| r.models.contains(&model));
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        runtime.apply(config).await?;
        let generation = runtime.current();
        let candidates = generation
            .table
            .resolve(&model, modality, &Default::default())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let instance = candidates
            .first()
            .expect("resolve returns at least one")
            .clone();
        let started = std::time::Instant::now();
        let events = EventStream::open(&instance, request, &runtime.metrics, &model, started)
            .map_err(|r| anyhow::anyhow!("{} refused the request: {r:?}", instance.name))?;
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
        runtime.shutdown(std::time::Duration::from_secs(5)).await;
        Ok::<_, anyhow::Error>(code)
    })
}

fn inspect(file: PathBuf) -> anyhow::Result<ExitCode> {
    let sha256 = registry::file_sha256(&file)?;
    let text = registry::read_manifest_text(&file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let manifest: serde_json::Value = serde_json::from_str(&text)?;
    // The layout check runs on a private copy, exactly as the registry would load it.
    let dir = std::env::temp_dir().join(format!("switchyard-inspect-{}", std::process::id()));
    let registry = registry::Registry::new(dir.clone())?;
    let verdict = match registry.load("inspected", &file, None) {
        Ok(p) => serde_json::json!({"compatible": true, "loaded_as": p.label()}),
        Err(e) => serde_json::json!({"compatible": false, "reason": e.to_string()}),
    };
    let _ = std::fs::remove_dir_all(dir);
    let out = serde_json::json!({
        "file": file, "sha256": sha256, "manifest": manifest,
        "host_api_version": switchyard_plugin_api::API_VERSION.to_string(), "check": verdict,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

fn check(file: PathBuf) -> anyhow::Result<ExitCode> {
    let config = match config::load(&file) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{}: invalid", file.display());
            for e in &errors.0 {
                eprintln!("  - {e}");
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut problems = Vec::new();
    for (i, plugin) in config.plugins.iter().enumerate() {
        let sha = registry::file_sha256(&plugin.path)?;
        if let Some(pin) = &plugin.sha256 {
            if !pin.eq_ignore_ascii_case(&sha) {
                problems.push(format!("plugins[{i}].sha256: pinned {pin}, file has {sha}"));
            }
        }
        match registry::read_manifest_json(&plugin.path) {
            Err(e) => problems.push(format!("plugins[{i}].path: {e}")),
            Ok(manifest) => {
                if !switchyard_plugin_api::API_VERSION.accepts(manifest.api_version) {
                    problems.push(format!(
                        "plugins[{i}].path: built for plugin API {}, host speaks {}",
                        manifest.api_version,
                        switchyard_plugin_api::API_VERSION
                    ));
                }
                for (j, model) in config
                    .models
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.plugin == plugin.name)
                {
                    if manifest.kind(&model.kind).is_none() {
                        problems.push(format!(
                            "models[{j}].kind: plugin {} has no kind {:?}",
                            plugin.name, model.kind
                        ));
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        println!(
            "{}: ok ({} plugins, {} models, {} routes)",
            file.display(),
            config.plugins.len(),
            config.models.len(),
            config.routes.len()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{}: invalid", file.display());
        for p in problems {
            eprintln!("  - {p}");
        }
        Ok(ExitCode::FAILURE)
    }
}
