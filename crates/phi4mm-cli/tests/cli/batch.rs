//! `phi4mm batch` on both fixture `mixed_batches`: requests from expanded ids plus the raw
//! WAV / PNG inputs, all through the scheduler at once; every row equals the reference tokens,
//! and its first-step log probabilities (the sampled token's and the top 5) the log-softmax of the
//! reference logits — on the host backend, and (feature `iree`) on the IREE backend.

use std::process::Command;

use switchyard_fixtures::*;

fn run(batch: &str, backend: &[&str]) {
    let b = &manifest()["mixed_batches"][batch];
    let inputs = fixture().join("inputs");
    let requests: Vec<serde_json::Value> = b["rows"]
        .as_array()
        .unwrap()
        .iter()
        .zip(b["adapter_names"].as_array().unwrap())
        .map(|(case, adapter)| {
            let case = case.as_str().unwrap();
            let m = &manifest()["model_cases"]["cases"][case];
            let ids: Vec<i64> = model_cases().i64(&format!("{case}.input_ids")).0;
            let audio: Vec<String> = m["audios"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| {
                    inputs
                        .join(format!("{}.wav", a.as_str().unwrap()))
                        .display()
                        .to_string()
                })
                .collect();
            let image: Vec<String> = m["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    inputs
                        .join(format!("{}.png", i["name"].as_str().unwrap()))
                        .display()
                        .to_string()
                })
                .collect();
            let adapter = match adapter.as_str().unwrap() {
                "__base__" => "none",
                a => a,
            };
            serde_json::json!({
                "input_ids": ids, "audio": audio, "image": image, "adapter": adapter,
                "max_new_tokens": 8, "ignore_eos": true, "logprobs": 5,
            })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("requests.json");
    std::fs::write(&file, serde_json::to_vec(&requests).unwrap()).unwrap();
    let out = crate::run_ok(
        Command::new(env!("CARGO_BIN_EXE_phi4mm"))
            .args(["batch", "--model"])
            .arg(fixture().join("model"))
            .arg("--requests")
            .arg(&file)
            .args(["--threads", "2"])
            .args(backend),
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), requests.len());
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(
            line["tokens"], b["greedy_tokens_per_row"][i],
            "{batch} row {i}"
        );
        let case = b["rows"][i].as_str().unwrap();
        let logits = model_cases().f32(&format!("{case}.logits_first")).0;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max
            + logits
                .iter()
                .map(|&l| (l as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let reference = |id: u64| logits[id as usize] as f64 - lse;
        // The fixture's logit tolerance, 1e-4 + 1e-4·|ref|, twice in the absolute part: a
        // logprob is a logit minus the log-sum-exp, and each may be off by it.
        let close = |got: f64, want: f64| (got - want).abs() <= 2e-4 + 1e-4 * want.abs();
        let first = &line["logprobs"][0];
        let sampled = line["tokens"][0].as_u64().unwrap();
        let got = first["logprob"].as_f64().unwrap();
        assert!(
            close(got, reference(sampled)),
            "{batch} row {i}: {got} vs {}",
            reference(sampled)
        );
        let mut ranked: Vec<u64> = (0..logits.len() as u64).collect();
        ranked.sort_by(|&a, &b| reference(b).total_cmp(&reference(a)));
        let top = first["top"].as_array().unwrap();
        assert_eq!(top.len(), 5, "{batch} row {i}");
        for (pair, &want_id) in top.iter().zip(&ranked) {
            let (id, lp) = (pair[0].as_u64().unwrap(), pair[1].as_f64().unwrap());
            assert_eq!(id, want_id, "{batch} row {i}: top ids");
            assert!(
                close(lp, reference(id)),
                "{batch} row {i}: token {id}: {lp} vs {}",
                reference(id)
            );
        }
    }
}

#[test]
fn batch_cli_mixed_audio_text() {
    run("mixed_audio_text", &[]);
}

#[test]
fn batch_cli_mixed_image_text() {
    run("mixed_image_text", &[]);
}

/// The IREE backend, on the artifact cache the other IREE tests share (same decoder context, so
/// the modules compiled once serve every test).
#[cfg(feature = "iree")]
fn iree_args() -> Vec<String> {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("iree-cache");
    vec![
        "--backend".into(),
        "iree".into(),
        "--iree-cache-dir".into(),
        cache.display().to_string(),
        "--iree-context".into(),
        "4160".into(),
    ]
}

#[cfg(feature = "iree")]
#[test]
fn batch_cli_mixed_audio_text_iree() {
    let a = iree_args();
    run(
        "mixed_audio_text",
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

#[cfg(feature = "iree")]
#[test]
fn batch_cli_mixed_image_text_iree() {
    let a = iree_args();
    run(
        "mixed_image_text",
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

/// The MLX producer in front of the host backend: MLX embeds the ids and runs the vision tower of
/// every image row while the batch decodes together.
#[cfg(feature = "mlx")]
#[test]
fn batch_cli_mixed_audio_text_mlx() {
    run("mixed_audio_text", &["--producer", "mlx"]);
}

#[cfg(feature = "mlx")]
#[test]
fn batch_cli_mixed_image_text_mlx() {
    run("mixed_image_text", &["--producer", "mlx"]);
}

/// The MLX producer in front of the IREE backend (its audio encoder and decoder).
#[cfg(all(feature = "mlx", feature = "iree"))]
#[test]
fn batch_cli_mixed_audio_text_iree_mlx() {
    let mut a = iree_args();
    a.extend(["--producer".into(), "mlx".into()]);
    run(
        "mixed_audio_text",
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

#[cfg(all(feature = "mlx", feature = "iree"))]
#[test]
fn batch_cli_mixed_image_text_iree_mlx() {
    let mut a = iree_args();
    a.extend(["--producer".into(), "mlx".into()]);
    run(
        "mixed_image_text",
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}
