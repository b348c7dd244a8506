//! Sample-rate bounds and the mel band count shared by the audio stages.

/// Number of mel bands of every feature row.
pub const N_MELS: usize = 80;
/// Rates below this are refused: the model was never trained on narrower-band audio.
pub const MIN_SAMPLE_RATE: u32 = 8000;
/// Rates above this are refused: nothing real records above 384 kHz. The polyphase filter's
/// length (10 × max(up, down) taps per side, large for a rate coprime to 16000) is bounded
/// separately by `max_resample_filter_taps`.
pub const MAX_SAMPLE_RATE: u32 = 384_000;
/// Samples beyond ± this are refused (full scale is ±1: integer PCM maps into it, and float
/// audio is meant to). No recording comes near it, and past about 1e15 the log-mel features
/// saturate (every feature ln(f64::MAX)) and then vanish (3e38 gave all zeros: a silent clip,
/// answered 200), where the reference's would overflow.
pub const MAX_SAMPLE_MAGNITUDE: f64 = 1e6;
