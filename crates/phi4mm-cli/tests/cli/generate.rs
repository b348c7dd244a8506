//! `phi4mm generate` end to end: the exact CLI interface, its JSON line and `--dump-logits`.

use std::process::Command;

use switchyard_fixtures::*;

fn case_ids(case: &str) -> String {
    let ids = model_cases().i64(&format!("{case}.input_ids")).0;
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn generate(args: &[&str]) -> (serde_json::Value, std::process::Output) {
    let out = crate::run_ok(
        Command::new(env!("CARGO_BIN_EXE_phi4mm"))
            .arg("generate")
            .args(args),
    );
    (crate::json_line(&out), out)
}

fn want_tokens(case: &str) -> serde_json::Value {
    model_cases().i64(&format!("{case}.greedy_tokens")).0.into()
}

#[test]
fn generate_ids_with_audio_and_dump_logits() {
    generate_audio_case(&["--backend", "host"]);
}

/// The same request on the IREE backend (the artifact cache the other IREE tests share, and
/// their decoder shape, so nothing is compiled twice).
#[cfg(feature = "iree")]
#[test]
fn generate_ids_with_audio_on_iree() {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("iree-cache");
    generate_audio_case(&[
        "--backend",
        "iree",
        "--iree-cache-dir",
        cache.to_str().unwrap(),
        "--iree-context",
        "4160",
    ]);
}

fn generate_audio_case(backend: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dump = tmp.path().join("logits.safetensors");
    let model = fixture().join("model-original");
    let wav = fixture().join("inputs/audio_16k.wav");
    let mut args = vec!["--model", model.to_str().unwrap()];
    args.extend_from_slice(backend);
    let ids = case_ids("audio_speech");
    args.extend_from_slice(&[
        "--input-ids",
        &ids,
        "--audio",
        wav.to_str().unwrap(),
        "--adapter",
        "auto",
        "--max-new-tokens",
        "8",
        "--ignore-eos",
        "--dump-logits",
        dump.to_str().unwrap(),
    ]);
    let (line, _) = generate(&args);
    assert_eq!(line["tokens"], want_tokens("audio_speech"));
    assert_eq!(line["prompt_tokens"], 40);
    assert!(line["text"].is_string());

    let bytes = std::fs::read(&dump).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits_first").unwrap();
    assert_eq!(t.shape(), &[1024]);
    let got: Vec<f32> = t
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (want, _) = model_cases().f32("audio_speech.logits_first");
    assert_matches_reference("dumped logits_first", &got, &want, 1e-4, 1e-4);
}

#[test]
fn generate_text_with_explicit_adapter() {
    let model = fixture().join("model");
    let (line, _) = generate(&[
        "--model",
        model.to_str().unwrap(),
        "--input-ids",
        &case_ids("text_vision"),
        "--adapter",
        "vision",
        "--max-new-tokens",
        "8",
        "--ignore-eos",
    ]);
    assert_eq!(line["tokens"], want_tokens("text_vision"));
    assert_eq!(line["prompt_tokens"], 18);
}

#[test]
fn generate_refuses_placeholder_mismatch() {
    let out = Command::new(env!("CARGO_BIN_EXE_phi4mm"))
        .args(["generate", "--model"])
        .arg(fixture().join("model"))
        .args(["--input-ids", "1021,1011,1020,1019", "--audio"])
        .arg(fixture().join("inputs/audio_16k.wav"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("placeholder"), "{err}");
}

#[test]
fn generate_from_messages_with_image_and_audio() {
    let case = "chat_image_audio_text";
    let m = &manifest()["model_cases"]["cases"][case];
    let tmp = tempfile::tempdir().unwrap();
    let messages = tmp.path().join("messages.json");
    std::fs::write(&messages, m["text_driven"]["messages"].to_string()).unwrap();
    let (line, _) = generate(&[
        "--model",
        fixture().join("model").to_str().unwrap(),
        "--messages",
        messages.to_str().unwrap(),
        "--image",
        fixture().join("inputs/img_small.png").to_str().unwrap(),
        "--audio",
        fixture().join("inputs/audio_16k.wav").to_str().unwrap(),
        "--max-new-tokens",
        "8",
        "--ignore-eos",
    ]);
    assert_eq!(line["tokens"], want_tokens(case));
    assert_eq!(line["prompt_tokens"], 559);
    assert_eq!(line["text"], m["text_driven"]["greedy_text"]);
}

#[test]
fn generate_from_prompt_with_image_stops_at_eos_by_default() {
    let (line, _) = generate(&[
        "--model",
        fixture().join("model-original").to_str().unwrap(),
        "--prompt",
        "<|image_1|>What is shown here?",
        "--image",
        fixture().join("inputs/img_wide.png").to_str().unwrap(),
        "--max-new-tokens",
        "5",
    ]);
    let tokens = line["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty() && tokens.len() <= 5);
    // <|user|> + 669 image rows + the question + <|end|><|assistant|>.
    assert!(line["prompt_tokens"].as_u64().unwrap() > 669);
}

/// An image + audio chat through `--producer mlx`: MLX embeds the ids and runs the vision tower,
/// the host backend keeps audio and the decoder; the same tokens, text and first-step logits as
/// the reference.
#[cfg(feature = "mlx")]
#[test]
fn generate_image_and_audio_with_the_mlx_producer() {
    generate_image_audio_mlx(&["--backend", "host"]);
}

/// The same over the IREE backend (its audio encoder and decoder; the shared artifact cache and
/// decoder shape of the other IREE tests).
#[cfg(all(feature = "mlx", feature = "iree"))]
#[test]
fn generate_image_and_audio_with_the_mlx_producer_on_iree() {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("iree-cache");
    generate_image_audio_mlx(&[
        "--backend",
        "iree",
        "--iree-cache-dir",
        cache.to_str().unwrap(),
        "--iree-context",
        "4160",
    ]);
}

#[cfg(feature = "mlx")]
fn generate_image_audio_mlx(backend: &[&str]) {
    let case = "chat_image_audio_text";
    let m = &manifest()["model_cases"]["cases"][case];
    let tmp = tempfile::tempdir().unwrap();
    let messages = tmp.path().join("messages.json");
    let dump = tmp.path().join("logits.safetensors");
    std::fs::write(&messages, m["text_driven"]["messages"].to_string()).unwrap();
    let model = fixture().join("model-original");
    let mut args = vec!["--model", model.to_str().unwrap()];
    args.extend_from_slice(backend);
    let (image, audio) = (
        fixture().join("inputs/img_small.png"),
        fixture().join("inputs/audio_16k.wav"),
    );
    args.extend_from_slice(&[
        "--producer",
        "mlx",
        "--messages",
        messages.to_str().unwrap(),
        "--image",
        image.to_str().unwrap(),
        "--audio",
        audio.to_str().unwrap(),
        "--max-new-tokens",
        "8",
        "--ignore-eos",
        "--dump-logits",
        dump.to_str().unwrap(),
    ]);
    let (line, _) = generate(&args);
    assert_eq!(line["tokens"], want_tokens(case));
    assert_eq!(line["text"], m["text_driven"]["greedy_text"]);
    let bytes = std::fs::read(&dump).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let got: Vec<f32> = st
        .tensor("logits_first")
        .unwrap()
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (want, _) = model_cases().f32(&format!("{case}.logits_first"));
    assert_matches_reference("dumped logits_first", &got, &want, 1e-4, 1e-4);
}

/// No silent fallback: a build without the `mlx` feature refuses `--producer mlx` by name.
#[cfg(not(feature = "mlx"))]
#[test]
fn generate_refuses_the_mlx_producer_without_the_feature() {
    let out = Command::new(env!("CARGO_BIN_EXE_phi4mm"))
        .args(["generate", "--producer", "mlx", "--model"])
        .arg(fixture().join("model"))
        .args(["--input-ids", "1,2,3", "--max-new-tokens", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("producer \"mlx\"") && err.contains("--features mlx"),
        "{err}"
    );
}

/// A checkpoint without `tokenizer.json` still generates from ids; its line has no `text`,
/// which an empty string would pass off as an empty answer.
#[test]
fn without_a_tokenizer_the_line_has_tokens_and_no_text() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture().join("model");
    for entry in std::fs::read_dir(&model).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "tokenizer.json" {
            continue;
        }
        let to = dir.path().join(&name);
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&to).unwrap();
            for file in std::fs::read_dir(entry.path()).unwrap() {
                let file = file.unwrap();
                std::fs::copy(file.path(), to.join(file.file_name())).unwrap();
            }
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
    let (line, _) = generate(&[
        "--model",
        dir.path().to_str().unwrap(),
        "--input-ids",
        &case_ids("text_base"),
        "--max-new-tokens",
        "2",
        "--ignore-eos",
    ]);
    let want = want_tokens("text_base");
    assert_eq!(
        line["tokens"],
        serde_json::Value::from(want.as_array().unwrap()[..2].to_vec()),
        "{line}"
    );
    assert!(line.get("text").is_none(), "{line}");
}
