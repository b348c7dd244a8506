//! The `phi4mm features | image | tokenize` subcommands (their exact interfaces are relied on
//! by other checks).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use switchyard_fixtures::{max_abs_diff, Tensors};

fn phi4mm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_phi4mm"))
        .args(args)
        .output()
        .expect("phi4mm runs")
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("frontend_cli_{}_{name}", std::process::id()))
}

fn fixture(rel: &str) -> String {
    switchyard_fixtures::fixture()
        .join(rel)
        .display()
        .to_string()
}

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "phi4mm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn open_abs(path: &Path) -> Tensors {
    Tensors::from_file(path)
}

#[test]
fn features_writes_embeds_and_sizes() {
    for (wav, mode, case) in [
        ("inputs/audio_44k.wav", "polyphase", "audio_44k"),
        ("inputs/audio_8k.wav", "reference", "audio_8k_reference"),
    ] {
        let out = tmp(&format!("{case}.safetensors"));
        ok(&phi4mm(&[
            "features",
            "--audio",
            &fixture(wav),
            "--resample",
            mode,
            "--out",
            out.to_str().unwrap(),
        ]));
        let got = open_abs(&out);
        let want = Tensors::open("audio_features.safetensors");
        let (values, shape) = got.f32("input_audio_embeds");
        let (want_values, want_shape) = want.f32(&format!("{case}.input_audio_embeds"));
        assert_eq!(shape, want_shape);
        assert!(max_abs_diff(&values, &want_values) <= 1e-4);
        assert_eq!(
            got.i64("audio_embed_sizes"),
            want.i64(&format!("{case}.audio_embed_sizes"))
        );
        std::fs::remove_file(out).ok();
    }
}

#[test]
fn image_writes_pixels_masks_sizes_and_tokens() {
    let out = tmp("img_maxcrops.safetensors");
    ok(&phi4mm(&[
        "image",
        "--image",
        &fixture("inputs/img_maxcrops.png"),
        "--dynamic-hd",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]));
    let got = open_abs(&out);
    let want = Tensors::open("image_preprocessing.safetensors");
    let (_, shape) = got.f32("pixel_values");
    assert_eq!(shape, vec![2, 3, 448, 448]);
    assert_eq!(
        got.u8("image_attention_mask"),
        want.u8("img_maxcrops.image_attention_mask")
    );
    assert_eq!(got.i64("image_sizes"), want.i64("img_maxcrops.image_sizes"));
    let tokens = switchyard_fixtures::manifest()["image_preprocessing"]["cases"]["img_maxcrops"]
        ["num_img_tokens"]
        .as_i64()
        .unwrap();
    assert_eq!(got.i64("num_img_tokens"), (vec![tokens], vec![1]));
    std::fs::remove_file(out).ok();
}

#[test]
fn tokenize_text_and_messages() {
    let manifest = switchyard_fixtures::manifest();
    let model = fixture("model");
    let case = &manifest["tokenizer"]["tokenizer_cases"][1];
    let stdout = ok(&phi4mm(&[
        "tokenize",
        "--model",
        &model,
        "--text",
        case["text"].as_str().unwrap(),
    ]));
    let got: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(got["ids"], case["ids"]);
    for case in manifest["tokenizer"]["chat_template_cases"]
        .as_array()
        .unwrap()
    {
        let file = tmp(&format!("{}.json", case["name"].as_str().unwrap()));
        std::fs::write(&file, case["messages"].to_string()).unwrap();
        let mut args = vec![
            "tokenize",
            "--model",
            &model,
            "--messages",
            file.to_str().unwrap(),
        ];
        if !case["add_generation_prompt"].as_bool().unwrap() {
            args.push("--no-generation-prompt");
        }
        let got: serde_json::Value = serde_json::from_str(&ok(&phi4mm(&args))).unwrap();
        assert_eq!(got["ids"], case["ids"], "{}", case["name"]);
        std::fs::remove_file(file).ok();
    }
}

#[test]
fn errors_go_to_stderr_with_a_nonzero_exit() {
    let file = tmp("reserved.json");
    std::fs::write(
        &file,
        r#"[{"role": "user", "content": "hi <|endoftext11|>"}]"#,
    )
    .unwrap();
    for args in [
        vec![
            "tokenize".to_string(),
            "--model".into(),
            fixture("model"),
            "--messages".into(),
            file.display().to_string(),
        ],
        vec![
            "features".into(),
            "--audio".into(),
            fixture("inputs/img_small.png"),
            "--out".into(),
            tmp("x.safetensors").display().to_string(),
        ],
        vec![
            "image".into(),
            "--image".into(),
            fixture("inputs/audio_16k.wav"),
            "--out".into(),
            tmp("y.safetensors").display().to_string(),
        ],
        vec![
            "features".into(),
            "--audio".into(),
            "/nonexistent.wav".into(),
            "--out".into(),
            tmp("z.safetensors").display().to_string(),
        ],
        vec![
            "generate".into(),
            "--model".into(),
            "/nonexistent-checkpoint".into(),
            "--prompt".into(),
            "hi".into(),
        ],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_phi4mm"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty());
        // Each cause is said once: an error whose text holds its cause does not also chain it.
        let parts: Vec<&str> = stderr.trim_end().split(": ").collect();
        for (i, part) in parts.iter().enumerate() {
            assert!(
                !parts[i + 1..].contains(part),
                "{args:?}: `{part}` is said twice: {stderr}"
            );
        }
    }
    std::fs::remove_file(file).ok();
}
