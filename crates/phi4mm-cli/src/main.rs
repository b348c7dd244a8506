//! `phi4mm`: developer and operator tool for the Phi4MM plugin.

mod batch;
mod bench;
mod bench_batch;
mod bench_checkpoint;
mod bench_frontend;
mod bench_vision;
mod bounds;
mod cache;
mod compile_progress;
mod generate;
mod peak;
mod ranges;

use clap::{Parser, Subcommand};

mod features;
mod image_prep;
mod tensors_out;
mod tokenize;

#[derive(Parser)]
#[command(
    name = "phi4mm",
    version,
    about = "Phi-4-multimodal tool: features, image prep, tokenize, generate, batch, benchmarks, the IREE artifact cache"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Audio clip → log-mel features (safetensors).
    Features(features::Args),
    /// Image → dynamic-HD crops, masks, sizes, token count (safetensors).
    Image(image_prep::Args),
    /// Text or chat messages → token ids (JSON on stdout).
    Tokenize(tokenize::Args),
    /// Generate greedily for one request (host or IREE backend); prints one JSON line.
    Generate(generate::GenerateArgs),
    /// Run every request of a JSON file concurrently through the scheduler; one JSON line each.
    Batch(batch::BatchArgs),
    /// Write a random bf16 checkpoint with the benchmark config.
    BenchCheckpoint(bench_checkpoint::BenchCheckpointArgs),
    /// Benchmark the host backend: bandwidth, GEMM, time to first token, decode tokens/s.
    Bench(bench::BenchArgs),
    /// Benchmark batched decoding (batch 1, 8, mixed adapters), host and/or IREE backend.
    BenchBatch(bench_batch::BenchBatchArgs),
    /// Benchmark the front end (log-mel from WAV bytes, image crops from PNG bytes and from
    /// pixels); prints one JSON line of medians.
    BenchFrontend(bench_frontend::BenchFrontendArgs),
    /// Benchmark the vision tower on one 1344×896 image: host, and MLX where built.
    BenchVision(bench_vision::BenchVisionArgs),
    /// The IREE artifact cache: warm (compile ahead), ls, verify, gc.
    Cache(cache::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Features(args) => features::run(args),
        Command::Image(args) => image_prep::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Batch(args) => batch::run(args),
        Command::BenchCheckpoint(args) => bench_checkpoint::bench_checkpoint(args),
        Command::Bench(args) => bench::bench(args),
        Command::BenchBatch(args) => bench_batch::run(args),
        Command::BenchFrontend(args) => bench_frontend::run(args),
        Command::BenchVision(args) => bench_vision::run(args),
        Command::Cache(args) => cache::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
