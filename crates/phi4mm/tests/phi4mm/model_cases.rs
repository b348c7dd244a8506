//! Every model case of the phi4mm-tiny fixture, from both checkpoint layouts: intermediates,
//! first-step logits and 8 greedy tokens against the independent reference.

use std::sync::{Arc, OnceLock};

use crate::model_support::*;
use switchyard_phi4mm::adapter::{AdapterChoice, AdapterMode};
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::Phi4mm;

fn model(layout_dir: &str) -> &'static Arc<Phi4mm> {
    static NATIVE: OnceLock<Arc<Phi4mm>> = OnceLock::new();
    static ORIGINAL: OnceLock<Arc<Phi4mm>> = OnceLock::new();
    let cell = if layout_dir == "model" {
        &NATIVE
    } else {
        &ORIGINAL
    };
    cell.get_or_init(|| {
        let ck = Checkpoint::open(&fixture().join(layout_dir)).expect("fixture checkpoint");
        Arc::new(Phi4mm::load(&ck, 2))
    })
}

pub(crate) fn run_case(layout_dir: &str, case: &str) {
    let model = model(layout_dir);
    let m = &manifest()["model_cases"]["cases"][case];
    let refs = model_cases();
    let mut input = case_input(case);
    let want_adapter = match m["adapter"].as_str().unwrap() {
        "__base__" => AdapterMode::None,
        "speech" => AdapterMode::Speech,
        "vision" => AdapterMode::Vision,
        other => panic!("adapter {other}"),
    };
    // Text-only cases pin an adapter explicitly (LoRA math alone); with media the automatic
    // choice must pick the case's adapter.
    if input.images.is_empty() && input.audios.is_empty() {
        input.adapter = AdapterChoice::Fixed(want_adapter);
    }
    let prepared = model.prepare(&input, 8).expect("valid input");
    assert_eq!(prepared.adapter, want_adapter, "{case}: adapter");

    let t = |n: &str| format!("{case}.{n}");
    if refs.has(&t("inputs_embeds")) {
        let (want, _) = refs.f32(&t("inputs_embeds"));
        assert_matches_reference(
            &format!("{case} inputs_embeds"),
            &prepared.embeds,
            &want,
            1e-4,
            0.0,
        );
    }
    if refs.has(&t("audio_encoder_out")) {
        let (want, _) = refs.f32(&t("audio_encoder_out"));
        assert_matches_reference(
            &format!("{case} audio_encoder_out"),
            &prepared.audio_encoder_out.concat(),
            &want,
            1e-4,
            0.0,
        );
    }
    if refs.has(&t("vision_features")) {
        let (want, _) = refs.f32(&t("vision_features"));
        assert_matches_reference(
            &format!("{case} vision_features"),
            &prepared.vision_features.concat(),
            &want,
            1e-4,
            0.0,
        );
    }

    // EOS ignored: always 8 tokens.
    let out = host_greedy(model, &prepared, 8);
    assert_matches_case(&format!("{case} ({layout_dir})"), case, &out);
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        mod transformers_layout {
            $(#[test] fn $name() { super::run_case("model", stringify!($name)); })*
        }
        mod original_layout {
            $(#[test] fn $name() { super::run_case("model-original", stringify!($name)); })*
        }
    };
}

cases!(
    text_base,
    text_speech,
    text_vision,
    audio_speech,
    audio_long_speech,
    image_vision,
    image2_vision,
    image_audio_vision,
    text_long_base,
    text_cross_base,
    chat_text,
    chat_image_text,
    chat_audio_text,
    chat_image_audio_text,
);

#[test]
fn global_image_band_matches_reference() {
    for name in ["img_wide", "img_tall"] {
        let img = image_input(name);
        let (band, shape) = image_preprocessing().f32(&format!("{name}.global_image"));
        let global = &img.pixel_values[..3 * 448 * 448];
        let (bh, bw) = (shape[1], shape[2]);
        let mut got = Vec::new();
        for c in 0..3 {
            for r in 0..bh {
                got.extend_from_slice(&global[(c * 448 + r) * 448..][..bw]);
            }
        }
        assert_matches_reference(name, &got, &band, 1e-5, 0.0);
    }
}

/// The audio cases from the WAV files through the media front end instead of the stored features.
fn run_case_from_wav(case: &str, wav: &str) {
    use frontend::audio::{features_from_bytes, AudioOptions};
    let model = model("model");
    let bytes = std::fs::read(fixture().join("inputs").join(wav)).unwrap();
    let f = features_from_bytes(&bytes, &AudioOptions::default()).unwrap();
    let mut input = case_input(case);
    input.audios = vec![switchyard_phi4mm::model::AudioInput {
        features: f.features,
        frames: f.frames,
    }];
    let prepared = model.prepare(&input, 8).expect("valid input");
    let out = host_greedy(model, &prepared, 8);
    assert_matches_case(&format!("{case} from {wav}"), case, &out);
}

#[test]
fn audio_speech_from_wav() {
    run_case_from_wav("audio_speech", "audio_16k.wav");
}

#[test]
fn audio_long_speech_from_wav() {
    run_case_from_wav("audio_long_speech", "audio_long_16k.wav");
}

/// The `chat_*` cases from their messages: tokenizer, chat template, placeholder binding and
/// expansion through the front end, media from the PNG / WAV files, then the model.
fn run_chat_case(layout_dir: &str, case: &str) {
    use frontend::prompt::{ContentPart, Message, Prompt, Role};
    let model = model(layout_dir);
    let m = &manifest()["model_cases"]["cases"][case];
    let mut messages: Vec<Message> =
        serde_json::from_value(m["text_driven"]["messages"].clone()).unwrap();
    let last_user = messages
        .iter_mut()
        .rev()
        .find(|msg| msg.role == Role::User)
        .unwrap();
    for img in m["images"].as_array().unwrap() {
        let path = fixture().join(format!("inputs/{}.png", img["name"].as_str().unwrap()));
        last_user.content.push(ContentPart::Image {
            bytes: std::fs::read(path).unwrap(),
        });
    }
    for clip in m["audios"].as_array().unwrap() {
        let path = fixture().join(format!("inputs/{}.wav", clip.as_str().unwrap()));
        last_user.content.push(ContentPart::Audio {
            bytes: std::fs::read(path).unwrap(),
        });
    }
    let prompt = Prompt::load(&fixture().join(layout_dir)).unwrap();
    let input = switchyard_phi4mm::request::from_messages(
        model,
        &prompt,
        &messages,
        &switchyard_phi4mm::request::MediaOptions::default(),
        AdapterChoice::Auto,
    )
    .expect("request");
    let want_ids: Vec<u32> = model_cases()
        .i64(&format!("{case}.input_ids"))
        .0
        .iter()
        .map(|&i| i as u32)
        .collect();
    assert_eq!(
        input.input_ids, want_ids,
        "{case}: input_ids from the messages"
    );
    let prepared = model.prepare(&input, 8).expect("valid input");
    let out = host_greedy(model, &prepared, 8);
    assert_matches_case(&format!("{case} ({layout_dir}) from messages"), case, &out);
    let text = prompt.tokenizer().decode(&out.tokens, true).unwrap();
    assert_eq!(
        text,
        m["text_driven"]["greedy_text"].as_str().unwrap(),
        "{case}: decoded text"
    );
}

macro_rules! chat_cases {
    ($($name:ident),* $(,)?) => {
        mod chat_from_messages {
            $(#[test] fn $name() {
                super::run_chat_case("model", stringify!($name));
                super::run_chat_case("model-original", stringify!($name));
            })*
        }
    };
}

chat_cases!(
    chat_text,
    chat_image_text,
    chat_audio_text,
    chat_image_audio_text
);

/// The id-driven image cases with pixels from the PNG files through the image front end.
fn run_case_from_png(case: &str) {
    let model = model("model");
    let m = &manifest()["model_cases"]["cases"][case];
    let mut input = case_input(case);
    input.images = m["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let bytes = std::fs::read(
                fixture().join(format!("inputs/{}.png", i["name"].as_str().unwrap())),
            )
            .unwrap();
            switchyard_phi4mm::request::image_input(&bytes, &Default::default()).unwrap()
        })
        .collect();
    let prepared = model.prepare(&input, 8).expect("valid input");
    let out = host_greedy(model, &prepared, 8);
    assert_matches_case(&format!("{case} from png"), case, &out);
}

#[test]
fn image_vision_from_png() {
    run_case_from_png("image_vision");
}

#[test]
fn image2_vision_from_png() {
    run_case_from_png("image2_vision");
}
