//! Request limits for the media front end.
//!
//! Every refusal names the limit it hit, so an operator reading a log line knows which setting to
//! raise. The struct is `serde`-deserializable with defaults for every field, so the plugin's TOML
//! settings can embed it as a table (`[models.settings.limits]`) and override only what they need.

use serde::{Deserialize, Serialize};

/// Default of [`Limits::max_audio_samples_per_clip`] and
/// [`Limits::max_audio_samples_per_request`]: 30 minutes at 48 kHz.
pub const DEFAULT_MAX_AUDIO_SAMPLES: u64 = 1800 * 48_000;
/// Default of [`Limits::max_resample_filter_taps`].
pub const DEFAULT_MAX_RESAMPLE_FILTER_TAPS: usize = 200_000;

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
    /// Decoded sample frames (samples per channel, at the clip's own rate) of one audio clip,
    /// checked from the container's header before decoding where it states its length, and while
    /// decoding otherwise (default 86,400,000: 30 min at 48 kHz; decoding holds 8 bytes per
    /// sample, so about 691 MB). The duration limit alone would let a 384 kHz clip decode to
    /// 691 million samples.
    pub max_audio_samples_per_clip: u64,
    /// Decoded sample frames of all audio clips of one request together, enforced the same way:
    /// a clip is refused from its header or stopped while decoding once the request's running
    /// total passes it (default 86,400,000).
    pub max_audio_samples_per_request: u64,
    /// Longest polyphase resampling filter one clip may need, in taps (default 200,000: about
    /// 1.6 MB and a few milliseconds of design). SciPy's filter has `20·max(up, down) + 1` taps
    /// for `up/down = 16000/fs` in lowest terms: every common rate needs at most 12,801
    /// (11,025 Hz), but a rate coprime to 16000 such as 44,101 Hz needs 882,021.
    pub max_resample_filter_taps: usize,
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
            max_audio_samples_per_clip: DEFAULT_MAX_AUDIO_SAMPLES,
            max_audio_samples_per_request: DEFAULT_MAX_AUDIO_SAMPLES,
            max_resample_filter_taps: DEFAULT_MAX_RESAMPLE_FILTER_TAPS,
            max_images: 16,
            max_image_pixels: 50_000_000,
            max_image_bytes: 32 << 20,
        }
    }
}

/// Limits that no request could be checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLimits {
    #[error("limits.max_audio_seconds must be finite and > 0")]
    AudioSeconds,
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
    #[error("total decoded audio samples {got} exceed max_audio_samples_per_request = {limit}")]
    AudioSamples { got: u64, limit: u64 },
}

impl Limits {
    /// Refuses limits no request could be checked against (an operator's settings).
    pub fn validate(&self) -> Result<(), InvalidLimits> {
        let seconds = self.max_audio_seconds;
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(InvalidLimits::AudioSeconds);
        }
        Ok(())
    }

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

    /// Checks the summed decoded sample frames of all clips of one request. Decoding already
    /// enforces this limit clip by clip when each clip's [`AudioOptions::request_samples_used`]
    /// carries the earlier clips' samples (as [`crate::audio::features_for_request`] does);
    /// this is the check for a caller that decodes clips on its own.
    ///
    /// [`AudioOptions::request_samples_used`]: crate::audio::AudioOptions::request_samples_used
    pub fn check_audio_samples_total(&self, total_samples: u64) -> Result<(), LimitError> {
        if total_samples > self.max_audio_samples_per_request {
            return Err(LimitError::AudioSamples {
                got: total_samples,
                limit: self.max_audio_samples_per_request,
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
