//! Audio front end: encoded clip → log-mel features `[frames, 80]` and the audio token count.
//!
//! Pipeline (docs/phi4mm-model.md §6, fixture README §7):
//! 1. [`decode`]: WAV through `hound` (PCM 8/16/24/32-bit int, 32-bit float), MP3/FLAC/Ogg through
//!    `symphonia`; channels averaged; integers scaled like `soundfile` (int16 → x / 32768).
//! 2. [`resample`]: `Polyphase` (default) resamples any rate ≥ 8 kHz to 16 kHz exactly like
//!    `scipy.signal.resample_poly`; `Reference` reproduces the original remote code's rate rules.
//! 3. [`features`]: per-frame pre-emphasis, Hamming window, FFT, the SpeechLib [`mel`] bank, log.
//!
//! Entry points: [`features_from_bytes`] and [`features_from_samples`].

mod constants;
pub mod decode;
mod error;
pub mod features;
mod ln;
pub mod mel;
mod metadata_guard;
mod options;
pub mod resample;
mod resample_mode;

use rayon::prelude::*;

pub use constants::{MAX_SAMPLE_MAGNITUDE, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, N_MELS};
pub use decode::{probe, ClipHeader, DecodedAudio};
pub use error::{AudioError, SampleLimit};
pub use options::{AudioOptions, AudioTokenRule};
pub use resample_mode::{ResampleMode, UnknownResampleMode};

/// Log-mel features of one clip.
#[derive(Clone, Debug, PartialEq)]
pub struct AudioFeatures {
    /// Row-major `[frames, 80]`, float32 (`input_audio_embeds` without the batch axis).
    pub features: Vec<f32>,
    /// Number of 10 ms frames.
    pub frames: usize,
    /// Audio tokens this clip occupies in the prompt (`audio_embed_sizes`).
    pub num_tokens: usize,
    /// Duration of the decoded clip in seconds (before resampling), for request-level limits.
    pub duration_s: f64,
    /// Decoded sample frames (before resampling), for request-level limits.
    pub samples: u64,
}

/// Feature frames of a clip of `samples` sample frames at `rate` Hz, as [`features_from_samples`]
/// computes them: the length after the rate rule of `mode`, then the windows of its path.
pub fn feature_frames(samples: u64, rate: u32, mode: ResampleMode) -> usize {
    let n = usize::try_from(samples).unwrap_or(usize::MAX);
    let scaled = |up: usize, down: usize| {
        let g = resample::gcd(up, down);
        let (up, down) = (up / g, down / g);
        if up == 1 && down == 1 {
            n
        } else {
            n.saturating_mul(up).div_ceil(down)
        }
    };
    let fs = rate as usize;
    let (len, wideband) = match mode {
        ResampleMode::Polyphase if fs == 16000 => (n, true),
        ResampleMode::Polyphase => (scaled(16000, fs), true),
        ResampleMode::Reference if fs > 16000 => (scaled(1, fs / 16000), true),
        ResampleMode::Reference => (n, fs == 16000),
    };
    if wideband {
        features::frame_count(len, features::WIN_16K, features::HOP_16K)
    } else {
        features::frame_count(len, features::WIN_8K, features::HOP_8K)
    }
}

/// Decodes an encoded clip (WAV, MP3, FLAC, Ogg Vorbis) and computes its log-mel features.
pub fn features_from_bytes(
    bytes: &[u8],
    options: &AudioOptions,
) -> Result<AudioFeatures, AudioError> {
    if bytes.len() > options.max_bytes {
        return Err(AudioError::TooManyBytes {
            got: bytes.len(),
            limit: options.max_bytes,
        });
    }
    let decoded = decode::decode_with(bytes, options)?;
    features_from_samples(&decoded.samples, decoded.sample_rate, options)
}

/// Computes log-mel features from already-decoded mono samples in [-1, 1] (float64, as
/// `soundfile` reads them) at `sample_rate` Hz.
pub fn features_from_samples(
    samples: &[f64],
    sample_rate: u32,
    options: &AudioOptions,
) -> Result<AudioFeatures, AudioError> {
    options.check_rate(sample_rate)?;
    if samples.is_empty() {
        return Err(AudioError::Empty);
    }
    let duration_s = samples.len() as f64 / f64::from(sample_rate);
    options.check_frames(samples.len() as u64, sample_rate)?;
    // Blocks over the pool, then the first bad sample of the first bad block.
    use crate::parallel::BLOCK;
    let bad = |v: &f64| !v.is_finite() | (v.abs() > constants::MAX_SAMPLE_MAGNITUDE);
    // Or-ed over runs of 64 samples without a branch per sample, so that it vectorises.
    let any_bad = |block: &[f64]| {
        block
            .chunks(64)
            .any(|run| run.iter().fold(false, |found, v| found | bad(v)))
    };
    if let Some(block) = samples.par_chunks(BLOCK).position_first(any_bad) {
        let index = block * BLOCK + samples[block * BLOCK..].iter().position(bad).unwrap_or(0);
        let value = samples[index];
        return Err(if value.is_finite() {
            AudioError::OutOfRange { index, value }
        } else {
            AudioError::NonFinite { index, value }
        });
    }
    let prepared = resample::prepare(samples, sample_rate, options.resample);
    let (features, frames) = match prepared.path {
        resample::SpectrumPath::Wideband16k => features::log_mel_16k(&prepared.waveform),
        resample::SpectrumPath::FillZero8k => features::log_mel_8k_fillzero(&prepared.waveform),
    };
    if frames == 0 {
        let (rate, window) = match prepared.path {
            resample::SpectrumPath::Wideband16k => (16000, features::WIN_16K),
            resample::SpectrumPath::FillZero8k => (8000, features::WIN_8K),
        };
        return Err(AudioError::TooShort {
            samples: prepared.waveform.len(),
            rate,
            window,
        });
    }
    Ok(AudioFeatures {
        features,
        frames,
        num_tokens: options.tokens.tokens(frames),
        duration_s,
        samples: samples.len() as u64,
    })
}

/// A failure in one of a request's clips, or in the request's audio totals.
#[derive(Debug, thiserror::Error)]
pub enum RequestAudioError {
    // Not a `source`: its text is in the message already.
    #[error("audio {index}: {cause}")]
    Clip { index: usize, cause: AudioError },
    #[error(transparent)]
    Limit(#[from] crate::limits::LimitError),
}

/// Features of one request's clips, in order, under the request's totals: each clip decodes with
/// [`AudioOptions::request_samples_used`] set to what the earlier clips decoded, so the clip that
/// passes `max_audio_samples_per_request` is refused from its header or stopped while decoding
/// rather than materialised, and the summed duration is checked against `max_seconds`
/// (`max_audio_seconds`) after each clip rather than once at the end.
pub fn features_for_request(
    clips: &[&[u8]],
    options: &AudioOptions,
) -> Result<Vec<AudioFeatures>, RequestAudioError> {
    let mut options = options.clone();
    let mut seconds = 0.0;
    let mut out = Vec::with_capacity(clips.len());
    for (index, clip) in clips.iter().enumerate() {
        let features = features_from_bytes(clip, &options)
            .map_err(|cause| RequestAudioError::Clip { index, cause })?;
        options.request_samples_used = options
            .request_samples_used
            .saturating_add(features.samples);
        seconds += features.duration_s;
        if seconds > options.max_seconds {
            return Err(crate::limits::LimitError::AudioSeconds {
                got_s: seconds,
                limit_s: options.max_seconds,
            }
            .into());
        }
        out.push(features);
    }
    Ok(out)
}
