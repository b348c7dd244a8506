//! The MLX producer (feature `mlx`) on every model case of the fixture, both checkpoint layouts,
//! in front of the host backend (and, with `iree` too, of the IREE backend): MLX embeds the ids
//! and runs the vision tower, the backend keeps audio and the decoder. Vision features and the
//! merged embeddings within 1e-4 of the fixture's reference, first-step logits within
//! 1e-4 + 1e-4·|ref|, greedy tokens equal to the reference.

use std::sync::Arc;

use crate::model_support::*;
use switchyard_fixtures::max_abs_diff;
use switchyard_phi4mm::adapter::AdapterChoice;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::mlx::weights::{in_view, MlxWeights};
use switchyard_phi4mm::mlx::{qualify, MlxProducer};
use switchyard_phi4mm::model::{HostBackend, MediaEncoders, Phi4mm};
use switchyard_phi4mm::step::{greedy, StepBackend};

const TOL: f32 = 1e-4;

/// It is called from the media worker threads.
#[allow(dead_code)]
fn send_sync<T: Send + Sync>() {}
const _: fn() = send_sync::<MlxProducer>;

fn check(what: &str, got: &[f32], want: &[f32]) {
    assert_matches_reference(what, got, want, TOL, 0.0);
    eprintln!("{what}: max abs diff {:.3e}", max_abs_diff(got, want));
}

/// Every case through `encoders` (the MLX producer) and `backend`'s decoder.
fn run_cases<B: StepBackend>(
    layout: &str,
    host: &Phi4mm,
    encoders: &dyn MediaEncoders,
    backend: &B,
    context: usize,
) {
    let refs = model_cases();
    let cases = manifest()["model_cases"]["cases"].as_object().unwrap();
    let (mut with_features, mut with_embeds) = (0, 0);
    for case in cases.keys() {
        let t = |n: &str| format!("{case}.{n}");
        let mut input = case_input(case);
        input.adapter = AdapterChoice::Fixed(case_adapter(case));
        let prepared = host
            .prepare_with(&input, 8, encoders, context)
            .unwrap_or_else(|e| panic!("{layout} {case}: {e}"));
        // Every case, text-only ones included (the fixture stores inputs_embeds for five): the
        // merged rows against the host producer's, the qualification's own yardstick.
        let on_host = host
            .prepare_with(&input, 8, host, context)
            .unwrap_or_else(|e| panic!("{layout} {case} (host producer): {e}"));
        check(
            &format!("{layout} {case} inputs_embeds vs host producer"),
            &prepared.embeds,
            &on_host.embeds,
        );
        if refs.has(&t("vision_features")) {
            let (want, _) = refs.f32(&t("vision_features"));
            check(
                &format!("{layout} {case} vision_features"),
                &prepared.vision_features.concat(),
                &want,
            );
            with_features += 1;
        }
        if refs.has(&t("inputs_embeds")) {
            let (want, _) = refs.f32(&t("inputs_embeds"));
            check(
                &format!("{layout} {case} inputs_embeds"),
                &prepared.embeds,
                &want,
            );
            with_embeds += 1;
        }
        let got = greedy(backend, &prepared.embeds, prepared.adapter, 8, &[]);
        assert_matches_case(&format!("{layout} {case}"), case, &got);
    }
    assert_eq!(with_features, 2, "cases with vision_features");
    assert_eq!(with_embeds, 5, "cases with inputs_embeds");
}

fn host_backend(layout: &str) {
    let ck = Checkpoint::open(&fixture().join(layout)).expect("fixture checkpoint");
    let host = Arc::new(Phi4mm::load(&ck, 2));
    let mlx = MlxProducer::start(&ck, host.clone(), host.clone()).expect("MLX producer");
    let context = host.config.text.max_position_embeddings;
    run_cases(layout, &host, &mlx, &HostBackend(host.clone()), context);
}

#[test]
fn every_case_host_backend_native_layout() {
    host_backend("model");
}

#[test]
fn every_case_host_backend_original_layout() {
    host_backend("model-original");
}

#[cfg(feature = "iree")]
fn iree_backend(layout: &str) {
    let ck = Checkpoint::open(&fixture().join(layout)).expect("fixture checkpoint");
    let host = Arc::new(Phi4mm::load(&ck, 2));
    let iree = crate::iree_support::backend(&ck, host.clone());
    let audio = iree.media_stage().encoders();
    let mlx = MlxProducer::start(&ck, host.clone(), audio).expect("MLX producer");
    run_cases(layout, &host, &mlx, &iree, iree.context());
}

#[cfg(feature = "iree")]
#[test]
fn every_case_iree_backend_native_layout() {
    iree_backend("model");
}

#[cfg(feature = "iree")]
#[test]
fn every_case_iree_backend_original_layout() {
    iree_backend("model-original");
}

/// MLX holds the embedding table and the vision tower only: no decoder layer, norm or LoRA, no
/// audio tensor.
#[test]
fn the_view_is_filtered() {
    let ck = Checkpoint::open(&fixture().join("model")).expect("fixture checkpoint");
    let weights = MlxWeights::load(&ck);
    let names: Vec<&str> = weights.names().collect();
    assert!(names.contains(&"model.embed_tokens.weight"));
    assert!(names
        .iter()
        .any(|n| n.ends_with("img_projection_up.weight")));
    for n in &names {
        assert!(
            !n.starts_with("model.layers.")
                && !n.contains("audio_embed")
                && *n != "model.norm.weight",
            "{n} should not be on MLX"
        );
    }
    let wanted = ck.tensor_names().filter(|n| in_view(n)).count();
    assert_eq!(names.len(), wanted);
    assert!(
        names.len() < ck.tensor_names().count() / 2,
        "{} of {}",
        names.len(),
        ck.tensor_names().count()
    );
}

/// The qualification's probe on both sides, and its comparison refusing a difference over the
/// tolerance and a NaN.
#[test]
fn qualification_probe_and_comparison() {
    let ck = Checkpoint::open(&fixture().join("model")).expect("fixture checkpoint");
    let host = Arc::new(Phi4mm::load(&ck, 2));
    let mlx = MlxProducer::start(&ck, host.clone(), host.clone()).expect("MLX producer");
    let image = qualify::probe_image(&mlx);
    let got = mlx.encode_image(&image).expect("MLX encode");
    let want = host.vision.encode(&image);
    check("probe features", &got.features, &want.features);
    check("probe embeds", &got.embeds, &want.embeds);
    assert!(qualify::compare("probe embeds", &got.embeds, &want.embeds).is_ok());
    assert_eq!(qualify::max_abs_diff(&[1.0, 2.0], &[1.0, 2.5]), 0.5);
    // Just over the tolerance, a NaN, and a length mismatch are all refused, by name.
    let over = qualify::compare("rows", &[1.0 + 2.0 * qualify::TOLERANCE], &[1.0]).unwrap_err();
    assert!(
        over.to_string()
            .contains("failed qualification: rows differ"),
        "{over}"
    );
    assert!(qualify::compare("rows", &[f32::NAN], &[1.0]).is_err());
    let short = qualify::compare("rows", &[1.0], &[1.0, 1.0]).unwrap_err();
    assert!(
        short.to_string().contains("rows: 1 values from MLX"),
        "{short}"
    );
    assert!(qualify::max_abs_diff(&[f32::NAN, 0.0], &[0.0, 0.0]).is_nan());
    assert!(qualify::max_abs_diff(&[0.0, 0.0], &[0.0, f32::NAN]).is_nan());
}

/// An id outside the vocabulary is refused by name, not gathered out of bounds.
#[test]
fn out_of_vocabulary_id_is_refused() {
    let ck = Checkpoint::open(&fixture().join("model")).expect("fixture checkpoint");
    let host = Arc::new(Phi4mm::load(&ck, 2));
    let mlx = MlxProducer::start(&ck, host.clone(), host.clone()).expect("MLX producer");
    let vocab = host.config.text.vocab_size as u32;
    let err = mlx.embed(&[1, vocab]).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    assert_eq!(mlx.embed(&[3, 5]).unwrap(), host.decoder.embed(&[3, 5]));
}

/// A crop with every patch masked: the host gives all-zero attention rows (not NaN), and so must
/// MLX.
#[test]
fn fully_masked_crop_matches_host() {
    let ck = Checkpoint::open(&fixture().join("model")).expect("fixture checkpoint");
    let host = Arc::new(Phi4mm::load(&ck, 2));
    let mlx = MlxProducer::start(&ck, host.clone(), host.clone()).expect("MLX producer");
    let mut img = image_input("img_small");
    let np = img.patch_masks.len() / img.crops;
    // The global crop: the useful grid is read from the sub-crops, so the token count holds.
    img.patch_masks[..np].fill(0);
    let got = mlx.encode_image(&img).expect("MLX encode");
    let want = host.vision.encode(&img);
    assert_eq!(got.tokens, want.tokens, "tokens");
    check(
        "masked crop features vs host",
        &got.features,
        &want.features,
    );
    check("masked crop embeds vs host", &got.embeds, &want.embeds);
}
