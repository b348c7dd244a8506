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

pub mod decode;
pub mod features;
pub mod mel;
pub mod resample;

use serde::{Deserialize, Serialize};

pub use decode::DecodedAudio;

/// Number of mel bands of every feature row.
pub const N_MELS: usize = 80;
/// Rates below this are refused: the model was never trained on narrower-band audio.
pub const MIN_SAMPLE_RATE: u32 = 8000;
/// Rates above this are refused: nothing real records above 384 kHz, and a large coprime rate
/// would make the polyphase filter (10 × max(up, down) taps per side) needlessly long.
pub const MAX_SAMPLE_RATE: u32 = 384_000;

/// How clips that are not 16 kHz reach the 16 kHz feature recipe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResampleMode {
    /// Proper resampling to 16 kHz (`scipy.signal.resample_poly(x, 16000/g, fs/g)`, Kaiser β = 5,
    /// g = gcd(16000, fs)). What a transformers caller does; the fixture's `audio_8k` /
    /// `audio_44k` cases.
    #[default]
    Polyphase,
    /// The original remote code bit for bit: above 16 kHz decimate by the integer `fs // 16000`
    /// and call the result 16 kHz (44.1 kHz is then processed as if it were 16 kHz); 8 kHz up to
    /// 16 kHz (exclusive) go through the 8 kHz "fillzero" spectrum path unresampled.
    Reference,
}

/// A resample mode name that is neither `polyphase` nor `reference`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown resample mode {0:?} (expected polyphase or reference)")]
pub struct UnknownResampleMode(pub String);

impl std::str::FromStr for ResampleMode {
    type Err = UnknownResampleMode;
    fn from_str(s: &str) -> Result<Self, UnknownResampleMode> {
        match s {
            "polyphase" => Ok(Self::Polyphase),
            "reference" => Ok(Self::Reference),
            other => Err(UnknownResampleMode(other.to_owned())),
        }
    }
}

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
}

impl Default for AudioOptions {
    fn default() -> Self {
        let limits = crate::limits::Limits::default();
        Self::from_limits(&limits)
    }
}

impl AudioOptions {
    /// Options with the per-clip limits of `limits` and default resampling.
    pub fn from_limits(limits: &crate::limits::Limits) -> Self {
        Self {
            resample: ResampleMode::default(),
            tokens: AudioTokenRule::default(),
            max_seconds: limits.max_audio_seconds,
            max_bytes: limits.max_audio_bytes,
        }
    }
}

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
}

/// Everything that can go wrong between clip bytes and features.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("audio clip is {got} bytes, over the limit max_audio_bytes = {limit}")]
    TooManyBytes { got: usize, limit: usize },
    #[error("audio clip lasts {got_s:.2} s, over the limit max_audio_seconds = {limit_s} s")]
    TooLong { got_s: f64, limit_s: f64 },
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
        "unsupported sample rate {0} Hz (accepted: {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz)"
    )]
    SampleRate(u32),
    #[error("audio has no channels")]
    NoChannels,
    #[error("unsupported WAV encoding: {0}")]
    UnsupportedWav(String),
    #[error("malformed or truncated WAV: {0}")]
    Wav(String),
    #[error("cannot decode audio: {0}")]
    Decode(String),
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
    let decoded = decode::decode(bytes, options.max_seconds)?;
    features_from_samples(&decoded.samples, decoded.sample_rate, options)
}

/// Computes log-mel features from already-decoded mono samples in [-1, 1] (float64, as
/// `soundfile` reads them) at `sample_rate` Hz.
pub fn features_from_samples(
    samples: &[f64],
    sample_rate: u32,
    options: &AudioOptions,
) -> Result<AudioFeatures, AudioError> {
    if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&sample_rate) {
        return Err(AudioError::SampleRate(sample_rate));
    }
    if samples.is_empty() {
        return Err(AudioError::Empty);
    }
    let duration_s = samples.len() as f64 / f64::from(sample_rate);
    if duration_s > options.max_seconds {
        return Err(AudioError::TooLong {
            got_s: duration_s,
            limit_s: options.max_seconds,
        });
    }
    if let Some((index, &value)) = samples.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(AudioError::NonFinite { index, value });
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
    })
}
