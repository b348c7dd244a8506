//! Checkpoint loading of both fixture layouts, and refusal of bad checkpoints before any compute.

use std::path::{Path, PathBuf};

use switchyard_phi4mm::checkpoint::{AdapterName, Checkpoint, CheckpointError, Layout};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/phi4mm-tiny")
}

#[test]
fn both_layouts_load_to_identical_tensors() {
    let native = Checkpoint::open(&fixture().join("model")).expect("transformers layout");
    let original = Checkpoint::open(&fixture().join("model-original")).expect("original layout");
    assert_eq!(native.layout, Layout::Transformers);
    assert_eq!(original.layout, Layout::Original);
    let names_a: Vec<_> = native.tensor_names().collect();
    let names_b: Vec<_> = original.tensor_names().collect();
    assert_eq!(names_a, names_b);
    assert_eq!(names_a.len(), 211);
    for name in names_a {
        assert_eq!(
            native.tensor(name).to_f32_vec(),
            original.tensor(name).to_f32_vec(),
            "{name}"
        );
    }
    let c = &native.config;
    assert_eq!(c.text.hidden_size, 48);
    assert_eq!(c.text.rotary_dim, 6);
    assert_eq!((c.image_token_id, c.audio_token_id), (1010, 1011));
    assert_eq!(c.audio.bias_max_distance, 16);
    assert_eq!(c.speech_lora.unwrap().r, 6);
    assert_eq!(c.vision_lora.unwrap().scale(), 2.0);
    let mut eos = c.eos_token_ids.clone();
    eos.sort();
    assert_eq!(eos, vec![1000, 1020]);
    // The configs of both layouts describe the same model.
    assert_eq!(native.config.text, original.config.text);
    assert_eq!(native.config.vision, original.config.vision);
    assert_eq!(native.config.audio, original.config.audio);
    assert_eq!(native.config.speech_lora, original.config.speech_lora);
    assert!(native
        .lora(1, "mlp.down_proj", AdapterName::Speech)
        .is_some());
}
