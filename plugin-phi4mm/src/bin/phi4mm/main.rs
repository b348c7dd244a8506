//! `phi4mm`: developer and operator tool for the Phi4MM plugin.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "phi4mm",
    version,
    about = "Phi-4-multimodal tool: features, image prep, tokenize, generate"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {}
}
