//! Options of one extraction: token rule and per-clip / per-request limits.

use serde::{Deserialize, Serialize};

use super::constants::{MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};
use super::error::{AudioError, SampleLimit};
use super::resample;
use super::resample_mode::ResampleMode;

/// Audio token count rule from the preprocessor config (`audio_compression_rate`,
/// `audio_downsample_rate`, `audio_feat_stride`; official values 8, 1, 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AudioTokenRule {
    pub compression_rate: usize,
    pub downsample_rate: usize,
    pub feat_stride: usize,
}

impl Default for AudioTokenRule {
    fn default() -> Self {
        Self {
            compression_rate: 8,
            downsample_rate: 1,
            feat_stride: 1,
        }
    }
}

impl AudioTokenRule {
    /// `ceil(ceil(frames·stride / compression) / downsample)`; equals the encoder's output length
    /// (three stride-2 convolutions) for the official values.
    pub fn tokens(&self, frames: usize) -> usize {
        let n1 = (frames * self.feat_stride.max(1)).div_ceil(self.compression_rate.max(1));
        n1.div_ceil(self.downsample_rate.max(1))
    }
}

/// Options of one extraction.
#[derive(Clone, Debug, PartialEq)]
pub struct AudioOptions {
    pub resample: ResampleMode,
    pub tokens: AudioTokenRule,
    /// Longest accepted clip, in seconds (checked from the header before decoding when the format
    /// states its length, and while decoding otherwise).
    pub max_seconds: f64,
    /// Largest accepted encoded clip, in bytes.
    pub max_bytes: usize,
    /// Most decoded sample frames of this clip (`max_audio_samples_per_clip`), checked like
    /// `max_seconds`: from the header where it states the length, and while decoding otherwise,
    /// before the samples are stored.
    pub max_samples_per_clip: u64,
    /// Most decoded sample frames of the whole request (`max_audio_samples_per_request`); this
    /// clip may decode at most `max_samples_per_request − request_samples_used`.
    pub max_samples_per_request: u64,
    /// Sample frames the request's earlier clips decoded (0 for a lone clip);
    /// [`features_for_request`](super::features_for_request) keeps it up to date.
    pub request_samples_used: u64,
    /// Longest resampling filter a clip's rate may need (`max_resample_filter_taps`), checked
    /// from the header's rate before decoding.
    pub max_filter_taps: usize,
}

impl Default for AudioOptions {
    fn default() -> Self {
        let limits = crate::limits::Limits::default();
        Self::from_limits(&limits)
    }
}

impl AudioOptions {
    /// Options with the per-clip and per-request limits of `limits` and default resampling.
    pub fn from_limits(limits: &crate::limits::Limits) -> Self {
        Self {
            resample: ResampleMode::default(),
            tokens: AudioTokenRule::default(),
            max_seconds: limits.max_audio_seconds,
            max_bytes: limits.max_audio_bytes,
            max_samples_per_clip: limits.max_audio_samples_per_clip,
            max_samples_per_request: limits.max_audio_samples_per_request,
            request_samples_used: 0,
            max_filter_taps: limits.max_resample_filter_taps,
        }
    }

    /// Checks a stream's rate (range and resampling cost) before anything is decoded.
    pub(crate) fn check_rate(&self, rate: u32) -> Result<(), AudioError> {
        if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&rate) {
            return Err(AudioError::SampleRate(rate));
        }
        let taps = resample::filter_taps(rate, self.resample);
        if taps > self.max_filter_taps {
            return Err(AudioError::ResampleCost {
                rate,
                taps,
                limit: self.max_filter_taps,
            });
        }
        Ok(())
    }

    /// The most sample frames a clip at `rate` may decode before one of the duration or sample
    /// limits is passed.
    pub fn max_frames(&self, rate: u32) -> u64 {
        let by_seconds = (self.max_seconds * f64::from(rate)).ceil();
        // `as` saturates: an infinite duration limit leaves only the sample limits.
        let by_seconds = if by_seconds.is_nan() {
            0
        } else {
            by_seconds as u64
        };
        by_seconds.min(self.max_samples_per_clip).min(
            self.max_samples_per_request
                .saturating_sub(self.request_samples_used),
        )
    }

    /// Checks a clip of `frames` sample frames at `rate` (stated by a header, counted while
    /// decoding, or handed in) against the duration and sample limits, in that order.
    pub(crate) fn check_frames(&self, frames: u64, rate: u32) -> Result<(), AudioError> {
        let seconds = frames as f64 / f64::from(rate);
        if seconds > self.max_seconds {
            return Err(AudioError::TooLong {
                got_s: seconds,
                limit_s: self.max_seconds,
            });
        }
        if frames > self.max_samples_per_clip {
            return Err(AudioError::TooManySamples {
                got: frames,
                rate,
                limit: self.max_samples_per_clip,
                which: SampleLimit::PerClip,
            });
        }
        let total = self.request_samples_used.saturating_add(frames);
        if total > self.max_samples_per_request {
            return Err(AudioError::TooManySamples {
                got: total,
                rate,
                limit: self.max_samples_per_request,
                which: SampleLimit::PerRequest,
            });
        }
        Ok(())
    }
}
