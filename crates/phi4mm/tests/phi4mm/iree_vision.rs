//! The IREE vision tower against the fixture and the host encoder, both checkpoint layouts: for
//! every case with images, the tower features (where the fixture has them), the projected rows at
//! the image placeholder positions of the fixture's merged embeddings (where it has them), and
//! the whole encoding against the host `VisionEncoder` (always).

use crate::model_support::*;
use switchyard_fixtures::max_abs_diff;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::iree::vision::IreeVision;
use switchyard_phi4mm::model::VisionEncoder;

const TOL: f32 = 1e-4;

/// It is called from the media worker threads.
#[allow(dead_code)]
fn send_sync<T: Send + Sync>() {}
const _: fn() = send_sync::<IreeVision>;

/// Asserts within [`TOL`] and prints the worst difference (the margin is worth seeing).
fn check(what: &str, got: &[f32], want: &[f32]) {
    assert_matches_reference(what, got, want, TOL, 0.0);
    eprintln!("{what}: max abs diff {:.3e}", max_abs_diff(got, want));
}

fn run(layout: &str) {
    let ck = Checkpoint::open(&fixture().join(layout)).expect("fixture checkpoint");
    let iree = IreeVision::load(&ck, crate::iree_support::context()).expect("IREE vision");
    let host = VisionEncoder::load(&ck);
    let image_token = ck.config.image_token_id;
    let th = ck.config.text.hidden_size;
    let refs = model_cases();
    let cases = manifest()["model_cases"]["cases"].as_object().unwrap();
    let (mut images, mut with_features, mut with_embeds) = (0, 0, 0);
    for (case, m) in cases {
        let names: Vec<&str> = m["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        if names.is_empty() {
            continue;
        }
        let t = |n: &str| format!("{case}.{n}");
        let mut features = Vec::new();
        let mut rows = Vec::new();
        for name in &names {
            let img = image_input(name);
            let got = iree.encode(&img).expect("IREE encode");
            let want = host.encode(&img);
            let what = format!("{layout} {case} {name}");
            assert_eq!(got.tokens, want.tokens, "{what}: tokens");
            assert_eq!(got.tokens, iree.token_count(&img), "{what}: token_count");
            assert_eq!(got.embeds.len(), got.tokens * th, "{what}: embeds shape");
            check(
                &format!("{what} features vs host"),
                &got.features,
                &want.features,
            );
            check(&format!("{what} embeds vs host"), &got.embeds, &want.embeds);
            features.extend_from_slice(&got.features);
            rows.extend_from_slice(&got.embeds);
            images += 1;
        }
        if refs.has(&t("vision_features")) {
            let (want, _) = refs.f32(&t("vision_features"));
            check(
                &format!("{layout} {case} vision_features"),
                &features,
                &want,
            );
            with_features += 1;
        }
        if refs.has(&t("inputs_embeds")) {
            let (all, _) = refs.f32(&t("inputs_embeds"));
            let ids = refs.i64(&t("input_ids")).0;
            let want: Vec<f32> = ids
                .iter()
                .enumerate()
                .filter(|(_, &id)| id == image_token as i64)
                .flat_map(|(p, _)| all[p * th..(p + 1) * th].iter().copied())
                .collect();
            check(
                &format!("{layout} {case} image rows of inputs_embeds"),
                &rows,
                &want,
            );
            with_embeds += 1;
        }
    }
    // image_vision, image2_vision (2 images), image_audio_vision, chat_image_text,
    // chat_image_audio_text.
    assert_eq!(images, 6, "images checked");
    assert_eq!(with_features, 2, "cases with vision_features");
    assert_eq!(with_embeds, 3, "cases with inputs_embeds");
}

#[test]
fn every_image_native_layout() {
    run("model");
}

#[test]
fn every_image_original_layout() {
    run("model-original");
}

/// A crop with every patch masked: the host softmax gives all-zero attention rows (not NaN), and
/// so must the IREE module's guarded softmax.
#[test]
fn fully_masked_crop_matches_host() {
    let ck = Checkpoint::open(&fixture().join("model")).expect("fixture checkpoint");
    let iree = IreeVision::load(&ck, crate::iree_support::context()).expect("IREE vision");
    let host = VisionEncoder::load(&ck);
    let mut img = image_input("img_small");
    let np = img.patch_masks.len() / img.crops;
    // The global crop: the useful grid is read from the sub-crops, so the token count holds.
    img.patch_masks[..np].fill(0);
    let got = iree.encode(&img).expect("IREE encode");
    let want = host.encode(&img);
    assert_eq!(got.tokens, want.tokens, "tokens");
    check(
        "masked crop features vs host",
        &got.features,
        &want.features,
    );
    check("masked crop embeds vs host", &got.embeds, &want.embeds);
}
