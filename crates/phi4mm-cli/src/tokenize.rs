//! `phi4mm tokenize`: text or chat messages → ids (placeholders not expanded).

use anyhow::Context;
use std::path::PathBuf;
use switchyard_phi4mm_frontend::prompt::{Message, Prompt};

/// Tokenize raw text or OpenAI-style messages with a checkpoint's tokenizer.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "messages"])))]
pub struct Args {
    /// Checkpoint directory (tokenizer.json, config.json).
    #[arg(long)]
    model: PathBuf,
    /// Raw prompt text (special tokens in it are honoured; placeholders are substituted).
    #[arg(long)]
    text: Option<String>,
    /// JSON file with `[{"role": ..., "content": ...}]`, rendered with the chat template.
    #[arg(long)]
    messages: Option<PathBuf>,
    /// Render messages without the trailing `<|assistant|>` (the eos token instead).
    #[arg(long)]
    no_generation_prompt: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let prompt = Prompt::load(&args.model)?;
    let ids = match (&args.text, &args.messages) {
        (Some(text), _) => prompt.encode_text(text)?,
        (None, Some(path)) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let messages: Vec<Message> = serde_json::from_slice(&bytes)
                .with_context(|| format!("parsing messages in {}", path.display()))?;
            prompt
                .tokenize_messages(&messages, !args.no_generation_prompt)?
                .1
        }
        (None, None) => unreachable!("clap requires --text or --messages"),
    };
    println!("{}", serde_json::json!({ "ids": ids }));
    Ok(())
}
