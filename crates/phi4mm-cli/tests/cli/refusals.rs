//! Values a user can mistype are refused before anything loads, each with one line naming the
//! option (or the request) and its range, a non-zero exit and nothing on stdout; and
//! `bench-checkpoint` does not write random weights over a folder that holds files.

use std::process::Command;

use switchyard_fixtures::fixture;

/// Runs `phi4mm args` and asserts that it failed without a panic or output on stdout, with
/// every phrase of `saying` in its stderr.
fn refused(args: &[&str], saying: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_phi4mm"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    for phrase in saying {
        assert!(
            stderr.contains(phrase),
            "{args:?}: {phrase:?} missing from {stderr}"
        );
    }
}

#[test]
fn numeric_options_out_of_range_are_refused_with_their_names() {
    let model = fixture().join("model");
    let model = model.to_str().unwrap();
    for (args, expected) in [
        (
            vec![
                "batch",
                "--model",
                model,
                "--requests",
                "r.json",
                "--slots",
                "0",
            ],
            "--slots <SLOTS>': must be in 1..=1024",
        ),
        (
            vec![
                "batch",
                "--model",
                model,
                "--requests",
                "r.json",
                "--slots",
                "100000000000",
            ],
            "--slots <SLOTS>': must be in 1..=1024",
        ),
        (
            vec![
                "generate",
                "--model",
                model,
                "--prompt",
                "hi",
                "--threads",
                "100000",
            ],
            "--threads <THREADS>': must be in 0..=1024",
        ),
        (
            vec![
                "generate",
                "--model",
                model,
                "--prompt",
                "hi",
                "--iree-prefill-chunk",
                "0",
            ],
            "--iree-prefill-chunk <IREE_PREFILL_CHUNK>': must be at least 1",
        ),
        (
            vec!["bench", "--model", model, "--prompt-tokens", "0"],
            "--prompt-tokens <PROMPT_TOKENS>': must be at least 1",
        ),
        (
            vec!["bench", "--model", model, "--new-tokens", "1"],
            "--new-tokens <NEW_TOKENS>': must be at least 2",
        ),
        (
            vec!["bench-batch", "--model", model, "--rounds", "0"],
            "--rounds <ROUNDS>': must be at least 1",
        ),
        (
            vec![
                "image",
                "--image",
                "x.png",
                "--dynamic-hd",
                "0",
                "--out",
                "o.st",
            ],
            "--dynamic-hd <DYNAMIC_HD>': must be at least 1",
        ),
    ] {
        refused(&args, &[expected]);
    }
}

#[test]
fn a_benchmark_prompt_beyond_the_checkpoints_positions_is_refused_before_it_runs() {
    let model = fixture().join("model");
    refused(
        &[
            "bench",
            "--model",
            model.to_str().unwrap(),
            "--prompt-tokens",
            "200000",
            "--bandwidth-bytes",
            "1000000",
        ],
        &["--prompt-tokens 200000 plus 32 new tokens exceeds the checkpoint's"],
    );
}

#[test]
fn a_batch_request_with_two_inputs_is_refused_by_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("requests.json");
    std::fs::write(
        &file,
        r#"[{"prompt": "hi", "max_new_tokens": 2}, {"prompt": "hi", "input_ids": [1, 2]}]"#,
    )
    .unwrap();
    refused(
        &[
            "batch",
            "--model",
            fixture().join("model").to_str().unwrap(),
            "--requests",
            file.to_str().unwrap(),
        ],
        &["request 1: give exactly one of input_ids, prompt or messages"],
    );
}

#[test]
fn a_requests_file_that_is_not_an_array_of_requests_says_what_it_must_be() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture().join("model");
    for (text, saying) in [
        (
            r#"{"prompt": "hi"}"#,
            "must be a JSON array of requests, like [{\"prompt\": \"Hello\"}]",
        ),
        (
            r#"[{"prompt": "hi"}, {"prompt": "hi", "max_tokens": 3}]"#,
            "request 1: unknown field `max_tokens`",
        ),
        ("[{", "not valid JSON"),
    ] {
        let file = dir.path().join("requests.json");
        std::fs::write(&file, text).unwrap();
        let file = file.to_str().unwrap();
        let args = [
            "batch",
            "--model",
            model.to_str().unwrap(),
            "--requests",
            file,
        ];
        refused(&args, &[file, saying]);
    }
}

/// The model counts media; an error about one names the file the user gave.
#[test]
fn a_broken_media_file_is_named_by_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.png");
    std::fs::write(&broken, b"not an image at all").unwrap();
    let good = fixture().join("inputs/img_small.png");
    let clip = fixture().join("inputs/audio_16k.wav");
    let model = fixture().join("model");
    let (model, good, broken) = (
        model.to_str().unwrap(),
        good.to_str().unwrap(),
        broken.to_str().unwrap(),
    );
    let image_1 = format!("{broken}: image 1: ");
    refused(
        &[
            "generate",
            "--model",
            model,
            "--prompt",
            "Describe both.",
            "--image",
            good,
            "--image",
            broken,
        ],
        &[&image_1],
    );
    let audio_0 = format!("{broken}: audio 0: ");
    refused(
        &[
            "generate",
            "--model",
            model,
            "--input-ids",
            "1,2,3",
            "--audio",
            broken,
            "--image",
            good,
        ],
        &[&audio_0],
    );
    // The same file as a batch request's.
    let file = dir.path().join("requests.json");
    let request = serde_json::json!([{"prompt": "hi", "audio": [clip.to_str().unwrap(), broken]}]);
    std::fs::write(&file, request.to_string()).unwrap();
    let batch = [
        "batch",
        "--model",
        model,
        "--requests",
        file.to_str().unwrap(),
    ];
    refused(&batch, &[&format!("request 0: {broken}: audio 1: ")]);
}

#[test]
fn an_unknown_kernel_path_is_named_by_its_option() {
    let model = fixture().join("model");
    refused(
        &[
            "bench",
            "--model",
            model.to_str().unwrap(),
            "--kernel-path",
            "avx9000",
        ],
        &["--kernel-path: \"avx9000\" is not one of auto, amx, avx512, avx2, scalar"],
    );
}

#[test]
fn bench_checkpoint_does_not_write_over_a_folder_with_files() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("config.json");
    std::fs::write(&kept, "{\"mine\": true}").unwrap();
    refused(
        &["bench-checkpoint", "--out", dir.path().to_str().unwrap()],
        &["is not empty", "--force"],
    );
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "{\"mine\": true}");
}

/// A prompt longer than the IREE decoder will hold is refused before a module compiles (on the
/// released model a cold compile takes minutes): the artifact cache stays empty.
#[cfg(feature = "iree")]
#[test]
fn an_iree_prompt_beyond_the_decoders_context_is_refused_before_compiling() {
    let cache = tempfile::tempdir().unwrap();
    let prompt = "word ".repeat(200);
    refused(
        &[
            "generate",
            "--model",
            fixture().join("model").to_str().unwrap(),
            "--prompt",
            &prompt,
            "--backend",
            "iree",
            "--iree-context",
            "128",
            "--iree-cache-dir",
            cache.path().to_str().unwrap(),
        ],
        &[
            "positions of the IREE decoder (--iree-context",
            "nothing was compiled",
        ],
    );
    let modules = walk(cache.path());
    assert!(modules.is_empty(), "compiled: {modules:?}");
}

#[cfg(feature = "iree")]
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| match e.path() {
            p if p.is_dir() => walk(&p),
            p => vec![p],
        })
        .collect()
}
