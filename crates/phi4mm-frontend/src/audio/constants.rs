//! Sample-rate bounds and the mel band count shared by the audio stages.

/// Number of mel bands of every feature row.
pub const N_MELS: usize = 80;
/// Rates below this are refused: the model was never trained on narrower-band audio.
pub const MIN_SAMPLE_RATE: u32 = 8000;
/// Rates above this are refused: nothing real records above 384 kHz. The polyphase filter's
/// length (10 × max(up, down) taps per side, large for a rate coprime to 16000) is bounded
/// separately by `max_resample_filter_taps`.
pub const MAX_SAMPLE_RATE: u32 = 384_000;
