//! `phi4mm features`: one audio clip → log-mel features.

use crate::tensors_out::{self, Out};
use anyhow::Context;
use std::path::PathBuf;
use switchyard_phi4mm_frontend::audio::{self, AudioOptions, ResampleMode};

/// Compute log-mel features of one clip (WAV, MP3, FLAC, Ogg).
#[derive(clap::Args)]
pub struct Args {
    /// Audio file.
    #[arg(long)]
    audio: PathBuf,
    /// `polyphase` (proper resampling to 16 kHz) or `reference` (the original code's rate rules).
    #[arg(long, default_value = "polyphase")]
    resample: ResampleMode,
    /// Output: `input_audio_embeds: f32 [1, frames, 80]`, `audio_embed_sizes: i64 [1]`.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(&args.audio).with_context(|| format!("reading {}", args.audio.display()))?;
    let options = AudioOptions {
        resample: args.resample,
        ..AudioOptions::default()
    };
    let features = audio::features_from_bytes(&bytes, &options)
        .with_context(|| format!("{}", args.audio.display()))?;
    tensors_out::write(
        &args.out,
        &[
            Out::f32(
                "input_audio_embeds",
                vec![1, features.frames, audio::N_MELS],
                &features.features,
            ),
            Out::i64("audio_embed_sizes", vec![1], &[features.num_tokens as i64]),
        ],
    )
}
