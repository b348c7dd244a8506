//! Arbitrary bytes through clip decoding (WAV via hound, else symphonia's probe) and features.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_phi4mm_frontend::audio::{self, AudioOptions, ResampleMode};

fuzz_target!(|data: &[u8]| {
    // A short duration limit keeps each input cheap; the limit code path is what is exercised.
    for resample in [ResampleMode::Polyphase, ResampleMode::Reference] {
        let options = AudioOptions { resample, max_seconds: 20.0, ..AudioOptions::default() };
        let _ = audio::features_from_bytes(data, &options);
    }
});
