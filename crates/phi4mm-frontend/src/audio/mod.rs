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
/// Rates above this are refused: nothing real records above 384 kHz. The polyphase filter's
/// length (10 × max(up, down) taps per side, large for a rate coprime to 16000) is bounded
/// separately by `max_resample_filter_taps`.
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
    /// Most decoded sample frames of this clip (`max_audio_samples_per_clip`), checked like
    /// `max_seconds`: from the header where it states the length, and while decoding otherwise,
    /// before the samples are stored.
    pub max_samples_per_clip: u64,
    /// Most decoded sample frames of the whole request (`max_audio_samples_per_request`); this
    /// clip may decode at most `max_samples_per_request − request_samples_used`.
    pub max_samples_per_request: u64,
    /// Sample frames the request's earlier clips decoded (0 for a lone clip);
    /// [`features_for_request`] keeps it up to date.
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
    pub(crate) fn max_frames(&self, rate: u32) -> u64 {
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
        samples: samples.len() as u64,
    })
}

/// A failure in one of a request's clips, or in the request's audio totals.
#[derive(Debug, thiserror::Error)]
pub enum RequestAudioError {
    #[error("audio {index}: {source}")]
    Clip {
        index: usize,
        #[source]
        source: AudioError,
    },
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
            .map_err(|source| RequestAudioError::Clip { index, source })?;
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
