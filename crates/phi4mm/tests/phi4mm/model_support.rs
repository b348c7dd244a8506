//! Shared helpers for the model tests: fixture paths, reference tensors, and model inputs built
//! from the fixture's precomputed features and preprocessed images.

use std::sync::Arc;
use switchyard_phi4mm::adapter::{AdapterChoice, AdapterMode};

use switchyard_phi4mm::model::{
    AudioInput, HostBackend, ImageInput, MergedPrompt, Phi4mm, PromptInput,
};
use switchyard_phi4mm::step::{greedy, GreedyOutput};

pub use switchyard_fixtures::{
    assert_matches_reference, audio_features, fixture, image_preprocessing, manifest, model_cases,
};

/// The fixture's log-mel features of a clip.
pub fn audio_input(clip: &str) -> AudioInput {
    let (features, shape) = audio_features().f32(&format!("{clip}.input_audio_embeds"));
    AudioInput {
        features,
        frames: shape[1],
    }
}

/// Pixel values rebuilt from the fixture's HD canvas (README section 8): normalise, cut tiles,
/// and bicubic-resize the whole canvas to one crop for the global image.
pub fn image_input(name: &str) -> ImageInput {
    let pre = image_preprocessing();
    let (hd, shape) = pre.u8(&format!("{name}.hd_image_uint8"));
    let (masks, mshape) = pre.u8(&format!("{name}.image_attention_mask"));
    let (h, w) = (shape[1], shape[2]);
    let x: Vec<f32> = hd.iter().map(|&u| (u as f32 - 127.5) / 127.5).collect();
    let s = 448;
    let (th, tw) = (h / s, w / s);
    let mut pixels = bicubic_resize(&x, 3, h, w, s, s);
    for i in 0..th {
        for j in 0..tw {
            for c in 0..3 {
                for r in 0..s {
                    let src = (c * h + i * s + r) * w + j * s;
                    pixels.extend_from_slice(&x[src..src + s]);
                }
            }
        }
    }
    ImageInput {
        pixel_values: pixels,
        patch_masks: masks,
        crops: mshape[0],
        canvas: [h, w],
    }
}

/// PyTorch `interpolate(mode="bicubic", align_corners=False)` without antialias, in f32.
pub fn bicubic_resize(x: &[f32], ch: usize, h: usize, w: usize, oh: usize, ow: usize) -> Vec<f32> {
    const A: f32 = -0.75;
    let c1 = |t: f32| ((A + 2.0) * t - (A + 3.0)) * t * t + 1.0;
    let c2 = |t: f32| ((A * t - 5.0 * A) * t + 8.0 * A) * t - 4.0 * A;
    let taps = |out: usize, inn: usize| -> Vec<([usize; 4], [f32; 4])> {
        let scale = inn as f32 / out as f32;
        (0..out)
            .map(|d| {
                let src = scale * (d as f32 + 0.5) - 0.5;
                let f = src.floor();
                let t = src - f;
                let i = f as isize;
                let idx = [i - 1, i, i + 1, i + 2].map(|k| k.clamp(0, inn as isize - 1) as usize);
                (idx, [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)])
            })
            .collect()
    };
    let ty = taps(oh, h);
    let tx = taps(ow, w);
    let mut out = vec![0.0; ch * oh * ow];
    for c in 0..ch {
        for (oy, (iy, wy)) in ty.iter().enumerate() {
            for (ox, (ix, wx)) in tx.iter().enumerate() {
                let mut acc = 0.0;
                for k in 0..4 {
                    let row = &x[(c * h + iy[k]) * w..];
                    let v = row[ix[0]] * wx[0]
                        + row[ix[1]] * wx[1]
                        + row[ix[2]] * wx[2]
                        + row[ix[3]] * wx[3];
                    acc += v * wy[k];
                }
                out[(c * oh + oy) * ow + ox] = acc;
            }
        }
    }
    out
}

/// Builds the id-driven input of a case from its manifest entry and the fixture's media tensors.
pub fn case_input(case: &str) -> PromptInput {
    let m = &manifest()["model_cases"]["cases"][case];
    let (ids, _) = model_cases().i64(&format!("{case}.input_ids"));
    PromptInput {
        input_ids: ids.iter().map(|&i| i as u32).collect(),
        images: m["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| image_input(i["name"].as_str().unwrap()))
            .collect(),
        audios: m["audios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| audio_input(a.as_str().unwrap()))
            .collect(),
        adapter: AdapterChoice::Auto,
    }
}

/// The adapter a case names in the manifest.
pub fn case_adapter(case: &str) -> AdapterMode {
    adapter_mode(
        manifest()["model_cases"]["cases"][case]["adapter"]
            .as_str()
            .unwrap(),
    )
}

/// The adapter a fixture names (`__base__`, `speech`, `vision`).
pub fn adapter_mode(name: &str) -> AdapterMode {
    match name {
        "__base__" => AdapterMode::None,
        "speech" => AdapterMode::Speech,
        "vision" => AdapterMode::Vision,
        other => panic!("adapter {other}"),
    }
}

/// The reference's greedy tokens of row `row` of the fixture's mixed batch `batch`.
pub fn mixed_row_tokens(batch: &str, row: usize) -> Vec<u32> {
    manifest()["mixed_batches"][batch]["greedy_tokens_per_row"][row]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Greedy decoding of a prepared prompt on the host backend, `max_new_tokens` exactly (EOS
/// ignored).
pub fn host_greedy(
    model: &Arc<Phi4mm>,
    prompt: &MergedPrompt,
    max_new_tokens: usize,
) -> GreedyOutput {
    greedy(
        &HostBackend(model.clone()),
        &prompt.embeds,
        prompt.adapter,
        max_new_tokens,
        &[],
    )
}

/// The reference's greedy tokens of a case (`<case>.greedy_tokens`).
pub fn reference_tokens(case: &str) -> Vec<u32> {
    model_cases()
        .i64(&format!("{case}.greedy_tokens"))
        .0
        .iter()
        .map(|&i| i as u32)
        .collect()
}

/// A greedy run of `case` against the reference: first-step logits within
/// `1e-4 + 1e-4·|ref|`, the tokens exact. `what` labels the failure.
pub fn assert_matches_case(what: &str, case: &str, out: &GreedyOutput) {
    let (want_logits, _) = model_cases().f32(&format!("{case}.logits_first"));
    assert_matches_reference(
        &format!("{what} logits_first"),
        &out.logits_first,
        &want_logits,
        1e-4,
        1e-4,
    );
    assert_eq!(out.tokens, reference_tokens(case), "{what}: greedy tokens");
}
