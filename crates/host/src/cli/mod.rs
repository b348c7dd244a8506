//! The `switchyard` command line: the arguments, `serve`, and the error report. This is the
//! binary's layer, so its errors are `anyhow`'s; the library modules below it have typed ones.

mod check;
mod run;

use crate::{config, runtime::Runtime, server};
use clap::{Parser, Subcommand};
use std::{io::IsTerminal, net::SocketAddr, path::PathBuf, process::ExitCode};

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
    Run(run::RunArgs),
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
        // Colour codes only on a terminal: a pod's log or a file gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match cli.command {
        Command::Serve {
            config,
            listen,
            admin_listen,
        } => serve(config, listen, admin_listen),
        Command::Run(args) => run::run(args),
        Command::Plugins {
            command: PluginsCommand::Inspect { file },
        } => check::inspect(file),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => check::config(file),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(
    path: PathBuf,
    listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
) -> anyhow::Result<ExitCode> {
    let config = config::load(&path)?;
    let listen = listen.unwrap_or(config.server().listen.parse()?);
    let admin = match admin_listen {
        Some(a) if !a.ip().is_loopback() => {
            anyhow::bail!("--admin-listen {a} is not a loopback address")
        }
        Some(a) => Some(a),
        None => config
            .server()
            .admin_listen
            .as_deref()
            .map(str::parse)
            .transpose()?,
    };
    let rt = tokio::runtime::Runtime::new()?;
    // Last before serving: it makes this process's directory of plugin copies, which every
    // error from here on removes.
    let runtime = Runtime::for_config(&path, &config)?;
    block_on_then_leave_behind(rt, async move {
        let served = async {
            let hup = crate::reload::triggers::catch_sighup();
            runtime.apply(config).await?;
            server::serve(runtime.clone(), listen, admin, hup).await?;
            Ok::<_, anyhow::Error>(())
        }
        .await;
        if served.is_err() {
            runtime.remove_shadow_copies();
        }
        served
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `work` on `rt`, then leaves the runtime's blocking threads behind rather than waiting
/// for them. One may be a plugin stuck creating an instance or checking settings past
/// `reload_timeout_secs` (a weights file on a hung mount), at start or in any earlier reload:
/// waiting for it kept a failed start from exiting (the process neither served nor ended), and
/// would keep a drained server from exiting on SIGTERM. Everything else is done by then.
pub(crate) fn block_on_then_leave_behind<T>(
    rt: tokio::runtime::Runtime,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let result = rt.block_on(work);
    rt.shutdown_background();
    result
}
