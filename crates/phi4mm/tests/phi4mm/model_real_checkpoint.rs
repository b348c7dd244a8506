//! The public test vector of the real checkpoint (docs/phi4mm-model.md §13): the official example
//! WAV `examples/what_is_shown_in_this_image.wav` → 351 feature frames → 44 audio rows, the prompt
//! `<|user|><|audio_1|>Transcribe the audio exactly.<|end|><|assistant|>` as ids, greedy tokens
//! `[13347, 382]` (speech LoRA, speech projection).
//!
//! The checkpoint is 11 GB, so this runs only when `PHI4MM_REAL_CHECKPOINT` points at a local copy
//! of `microsoft/Phi-4-multimodal-instruct` (either layout; the WAV is read from its `examples/`
//! folder, or from `PHI4MM_REAL_WAV`). Without the variable the test returns early and says so.
//!
//! ```text
//! PHI4MM_REAL_CHECKPOINT=/path/to/Phi-4-multimodal-instruct \
//!   cargo test --release -p switchyard-phi4mm --test phi4mm model_real_checkpoint -- --nocapture
//! ```

use std::path::PathBuf;

use frontend::audio::{features_from_bytes, AudioOptions};
use switchyard_phi4mm::adapter::{AdapterChoice, AdapterMode};
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::{AudioInput, Phi4mm, PromptInput};

#[test]
fn public_vector_transcribes_example_wav() {
    let Some(dir) = std::env::var_os("PHI4MM_REAL_CHECKPOINT").map(PathBuf::from) else {
        eprintln!("PHI4MM_REAL_CHECKPOINT is not set: skipping the real-checkpoint test");
        return;
    };
    let wav = std::env::var_os("PHI4MM_REAL_WAV")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("examples/what_is_shown_in_this_image.wav"));
    let bytes = std::fs::read(&wav).unwrap_or_else(|e| panic!("{}: {e}", wav.display()));
    let feats = features_from_bytes(&bytes, &AudioOptions::default()).expect("features");
    assert_eq!(feats.frames, 351, "feature frames");
    assert_eq!(feats.num_tokens, 44, "audio rows");
    // Spot values of the published features.
    for (i, want) in [
        (0, 7.4316354f64),
        (10, 4.5914502),
        (80 + 10, 4.869408),
        (350 * 80 + 79, 8.841826),
    ] {
        assert!(
            (f64::from(feats.features[i]) - want).abs() < 2e-3,
            "feature {i}: {} vs {want}",
            feats.features[i]
        );
    }

    let ck = Checkpoint::open(&dir).expect("real checkpoint validates");
    let model = std::sync::Arc::new(Phi4mm::load(&ck, 0));
    let (user, audio, end, assistant) = (200021, model.config.audio_token_id, 200020, 200019);
    let mut ids = vec![user];
    ids.extend(std::iter::repeat_n(audio, 44));
    ids.extend([3248, 4981, 290, 11065, 9707, 13, end, assistant]);
    let prompt = model
        .prepare(
            &PromptInput {
                input_ids: ids,
                images: Vec::new(),
                audios: vec![AudioInput {
                    features: feats.features,
                    frames: feats.frames,
                }],
                adapter: AdapterChoice::Auto,
            },
            2,
        )
        .expect("valid input");
    assert_eq!(prompt.adapter, AdapterMode::Speech);
    // First encoder outputs as published: bf16 values from a port that runs the encoder in bf16,
    // so only a loose check against this f32 implementation.
    let enc = &prompt.audio_encoder_out[0];
    let want_enc = [
        -0.04736328125f64,
        -0.419921875,
        0.455078125,
        -0.0224609375,
        0.2890625,
        -0.09423828125,
        -0.064453125,
        -0.306640625,
    ];
    for (i, w) in want_enc.iter().enumerate() {
        assert!(
            (f64::from(enc[i]) - w).abs() < 0.1,
            "encoder out {i}: {} vs {w}",
            enc[i]
        );
    }
    let out = crate::model_support::host_greedy(&model, &prompt, 2);
    assert_eq!(out.tokens, vec![13347, 382]);
}
