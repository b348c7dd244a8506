//! Arbitrary bytes through clip decoding (WAV via hound, else symphonia's probe) and features,
//! alone and as a two-clip request under the request's sample total.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_phi4mm_frontend::audio::{self, AudioOptions, ResampleMode};

fuzz_target!(|data: &[u8]| {
    // Short duration and sample limits keep each input cheap; the limit code paths are what is
    // exercised (a 384 kHz clip would otherwise decode 7.7 million samples within 20 s).
    for resample in [ResampleMode::Polyphase, ResampleMode::Reference] {
        let options = AudioOptions {
            resample,
            max_seconds: 20.0,
            max_samples_per_clip: 1_000_000,
            max_samples_per_request: 1_500_000,
            ..AudioOptions::default()
        };
        let single = audio::features_from_bytes(data, &options);
        if let Ok(f) = &single {
            assert!(f.samples <= options.max_samples_per_clip, "{} samples", f.samples);
            assert_eq!(f.features.len(), f.frames * audio::N_MELS);
        }
        if resample == ResampleMode::Polyphase {
            // The same clip twice is accepted only within the request totals. (Not the converse:
            // a header may state more samples than the stream holds, and the stated count is
            // what the second clip is refused on.)
            if let Ok(both) = audio::features_for_request(&[data, data], &options) {
                let f = single.as_ref().expect("a clip accepted in a request is accepted alone");
                assert!(both.iter().all(|g| g.samples == f.samples));
                assert!(2 * f.samples <= options.max_samples_per_request);
                assert!(2.0 * f.duration_s <= options.max_seconds);
            }
        }
    }
});
