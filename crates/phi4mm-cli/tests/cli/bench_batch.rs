//! `phi4mm bench-batch` keeps its JSON contract on the fixture checkpoint: one line, the bounds
//! it measured in the run, each backend's figures as fractions of them, and (feature `iree`)
//! `iree_over_host` with every ratio. No figure is judged for speed here; the tiny model's
//! figures are overheads. What is checked is what a reader of `docs/benchmarks.md` relies on.

use std::process::Command;

use serde_json::Value;
use switchyard_fixtures::*;

fn bench_batch(extra: &[&str]) -> Value {
    let out = crate::run_ok(
        Command::new(env!("CARGO_BIN_EXE_phi4mm"))
            .args(["bench-batch", "--model"])
            .arg(fixture().join("model"))
            .args(["--rounds", "1", "--prompt-tokens", "8", "--new-tokens", "2"])
            .args(["--threads", "2", "--bandwidth-bytes", "67108864"])
            .args(extra),
    );
    crate::json_line(&out)
}

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

/// A backend's figures: rates, and prefill as a fraction of the FMA peak, which no prefill can
/// reach (a fraction at or above 1 means the work count or the peak is wrong).
fn check_figures(r: &Value, backend: &str) {
    let f = &r[backend];
    positive(&f["prefill_tokens_per_s"], "prefill_tokens_per_s");
    positive(&f["decode_tokens_per_s_batch1"], "decode batch 1");
    positive(&f["decode_tokens_per_s_batch8"], "decode batch 8");
    let of_peak = positive(&f["prefill_fraction_of_peak"], "prefill_fraction_of_peak");
    assert!(of_peak < 1.0, "{backend} prefill at {of_peak} of the peak");
    let gflops = positive(&f["prefill_gflops"], "prefill_gflops");
    let per_token = positive(
        &r["bounds"]["prefill_gflop_per_token"],
        "prefill_gflop_per_token",
    );
    let tok_s = f["prefill_tokens_per_s"].as_f64().unwrap();
    assert!((gflops - tok_s * per_token).abs() <= 1e-9 * gflops.max(1.0));
    // The tiny model's weights sit in cache, so batch-1 decode may beat the memory bound here.
    positive(
        &f["decode_batch1_fraction_of_bandwidth_bound"],
        "decode_batch1_fraction_of_bandwidth_bound",
    );
}

fn check_bounds(r: &Value) {
    let b = &r["bounds"];
    // Each bound is measured before the rounds and after them, and is the higher of the two.
    for (bound, measured) in [
        ("peak_gflops", "peak_gflops_measured"),
        ("read_bandwidth_gb_s", "read_bandwidth_gb_s_measured"),
    ] {
        let best = positive(&b[bound], bound);
        let each: Vec<f64> = b[measured]
            .as_array()
            .unwrap_or_else(|| panic!("{measured}: {b}"))
            .iter()
            .map(|v| positive(v, measured))
            .collect();
        assert_eq!(each.len(), 2, "{measured}: {b}");
        assert_eq!(best, each.iter().copied().fold(0.0, f64::max), "{b}");
    }
    positive(&b["decode_batch1_bound_tokens_per_s"], "decode bound");
    // Every decoder linear and the (tied) LM head, in the checkpoint's bf16: at least the
    // embedding table, vocabulary × hidden × 2 bytes.
    let text = &r["config"];
    let head = text["vocab"].as_u64().unwrap() * text["hidden"].as_u64().unwrap() * 2;
    assert!(b["decode_weight_bytes"].as_u64().unwrap() > head, "{b}");
    assert!(
        ["avx512", "avx2", "amx", "scalar"].contains(&b["peak_vector_path"].as_str().unwrap()),
        "{b}"
    );
}

#[test]
fn bench_batch_reports_figures_against_its_bounds() {
    let r = bench_batch(&[]);
    check_bounds(&r);
    check_figures(&r, "host");
    positive(&r["encoders"]["host_audio_30s_ms"], "host audio");
    positive(&r["encoders"]["host_vision_1344x896_ms"], "host vision");
    check_encoder_rounds(&r, "host");
    assert!(r.get("iree_over_host").is_none(), "host only: {r}");
    assert!(
        r.get("iree_over_host_median_of_rounds").is_none(),
        "host only: {r}"
    );
}

/// Each encoder timing of `backend` lists one time per round, and its best is their least.
fn check_encoder_rounds(r: &Value, backend: &str) {
    for encoder in ["audio_30s", "vision_1344x896"] {
        let key = format!("{backend}_{encoder}_ms");
        let rounds: Vec<f64> = r["encoders"][format!("{key}_rounds")]
            .as_array()
            .unwrap_or_else(|| panic!("{key}_rounds: {r}"))
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(rounds.len() as u64, r["rounds"].as_u64().unwrap(), "{key}");
        assert!(rounds.iter().all(|&t| t > 0.0), "{key}: {rounds:?}");
        let best = rounds.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(r["encoders"][&key].as_f64(), Some(best), "{key}");
    }
}

/// Both backends side by side, on the artifact cache the other IREE tests share (same decoder
/// context): `iree_over_host` holds every ratio, and the second load compiles nothing.
#[cfg(feature = "iree")]
#[test]
fn bench_batch_both_backends_report_every_ratio() {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("iree-cache");
    let r = bench_batch(&[
        "--backend",
        "both",
        "--iree-cache-dir",
        cache.to_str().unwrap(),
        "--iree-context",
        "4160",
    ]);
    check_bounds(&r);
    check_figures(&r, "host");
    check_figures(&r, "iree");
    for key in [
        "prefill",
        "decode_batch1",
        "decode_batch8",
        "audio_30s",
        "vision_1344x896",
    ] {
        positive(&r["iree_over_host"][key], key);
        positive(&r["iree_over_host_median_of_rounds"][key], key);
    }
    check_encoder_rounds(&r, "host");
    check_encoder_rounds(&r, "iree");
    let warm = r["iree_modules"]["warm"].as_array().unwrap();
    assert!(!warm.is_empty());
    for m in warm {
        assert_eq!(m["compiled"], false, "a warm load compiled {m}");
    }
}
