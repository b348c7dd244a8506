//! Errors of the audio front end.

use super::constants::{MAX_SAMPLE_MAGNITUDE, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};

/// What the audio front end reads, as its refusals list it.
pub const ACCEPTED: &str =
    "WAV of 8-, 16-, 24- or 32-bit integer or 32-bit float PCM, FLAC, MP3 or Ogg Vorbis";

/// Which decoded-sample limit a clip passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleLimit {
    /// `max_audio_samples_per_clip`: the clip alone.
    PerClip,
    /// `max_audio_samples_per_request`: the clip with the request's earlier clips.
    PerRequest,
}

impl std::fmt::Display for SampleLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SampleLimit::PerClip => "max_audio_samples_per_clip",
            SampleLimit::PerRequest => "max_audio_samples_per_request",
        })
    }
}

/// Everything that can go wrong between clip bytes and features.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("audio clip is {got} bytes, over the limit max_audio_bytes = {limit}")]
    TooManyBytes { got: usize, limit: usize },
    #[error("audio clip lasts {got_s:.2} s, over the limit max_audio_seconds = {limit_s} s")]
    TooLong { got_s: f64, limit_s: f64 },
    #[error("audio clip has {got} samples ({rate} Hz), over the limit {which} = {limit}")]
    TooManySamples {
        /// Sample frames of the clip (with the request's earlier clips for
        /// [`SampleLimit::PerRequest`]): stated by the header, or counted when decoding stopped.
        got: u64,
        rate: u32,
        limit: u64,
        which: SampleLimit,
    },
    #[error("audio clip is empty (no samples)")]
    Empty,
    #[error("audio clip too short: {samples} samples at {rate} Hz give no {window}-sample analysis frame")]
    TooShort {
        samples: usize,
        rate: u32,
        window: usize,
    },
    #[error("audio sample {index} is not finite ({value})")]
    NonFinite { index: usize, value: f64 },
    #[error(
        "audio sample {index} is {value:e}, beyond ±{MAX_SAMPLE_MAGNITUDE:e} (full scale is ±1)"
    )]
    OutOfRange { index: usize, value: f64 },
    #[error(
        "unsupported sample rate {0} Hz (accepted: {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz)"
    )]
    SampleRate(u32),
    #[error("sample rate {rate} Hz needs a {taps}-tap resampling filter, over the limit max_resample_filter_taps = {limit}")]
    ResampleCost {
        rate: u32,
        taps: usize,
        limit: usize,
    },
    #[error("audio has no channels")]
    NoChannels,
    /// A clip in a container, codec or sample encoding this front end does not read; the
    /// message lists what it reads, rather than the decoder library's own words.
    #[error("unsupported audio: {0} (accepted: {ACCEPTED})")]
    Unsupported(String),
    #[error("malformed or truncated WAV: {0}")]
    Wav(String),
    #[error("cannot decode audio: {0}")]
    Decode(String),
}
