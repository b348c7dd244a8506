//! Request limits for the media front end.
//!
//! Every refusal names the limit it hit, so an operator reading a log line knows which setting to
//! raise. The struct is `serde`-deserializable with defaults for every field, so the plugin's TOML
//! settings can embed it as a table (`[models.settings.limits]`) and override only what they need.

use serde::{Deserialize, Serialize};

/// Limits applied before and while decoding request media.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Audio clips in one request (default 16).
    pub max_audio_clips: usize,
    /// Total audio duration of one request, in seconds (default 1800 = 30 min).
    pub max_audio_seconds: f64,
    /// Encoded size of one audio clip, in bytes (default 512 MiB: 30 min of 48 kHz stereo 32-bit
    /// WAV is about 690 MB, 16-bit about 345 MB).
    pub max_audio_bytes: usize,
    /// Images in one request (default 16).
    pub max_images: usize,
    /// Decoded pixels (width × height) of one image, checked from the header before decoding
    /// (default 50 megapixels, below Pillow's decompression-bomb threshold of 89.5 MP).
    pub max_image_pixels: u64,
    /// Encoded size of one image, in bytes (default 32 MiB).
    pub max_image_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_audio_clips: 16,
            max_audio_seconds: 1800.0,
            max_audio_bytes: 512 << 20,
            max_images: 16,
            max_image_pixels: 50_000_000,
            max_image_bytes: 32 << 20,
        }
    }
}

/// A request-level limit was exceeded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    #[error("too many audio clips: {got} (limit max_audio_clips = {limit})")]
    AudioClips { got: usize, limit: usize },
    #[error("too many images: {got} (limit max_images = {limit})")]
    Images { got: usize, limit: usize },
    #[error("total audio duration {got_s:.2} s exceeds max_audio_seconds = {limit_s} s")]
    AudioSeconds { got_s: f64, limit_s: f64 },
}

impl Limits {
    /// Checks the media counts of one request before anything is decoded.
    pub fn check_counts(&self, images: usize, audio_clips: usize) -> Result<(), LimitError> {
        if images > self.max_images {
            return Err(LimitError::Images {
                got: images,
                limit: self.max_images,
            });
        }
        if audio_clips > self.max_audio_clips {
            return Err(LimitError::AudioClips {
                got: audio_clips,
                limit: self.max_audio_clips,
            });
        }
        Ok(())
    }

    /// Checks the summed duration of all clips of one request (each clip is also checked alone
    /// while it is decoded, so no single clip can allocate past the limit).
    pub fn check_audio_total(&self, total_seconds: f64) -> Result<(), LimitError> {
        if total_seconds > self.max_audio_seconds {
            return Err(LimitError::AudioSeconds {
                got_s: total_seconds,
                limit_s: self.max_audio_seconds,
            });
        }
        Ok(())
    }
}
