//! Prompt front end against the phi4mm-tiny fixture (manifest `tokenizer` cases, chat template
//! cases and the text-driven model cases' `input_ids`).

use serde_json::Value;
use switchyard_fixtures::Tensors;
use switchyard_phi4mm_frontend::audio::{self, AudioOptions};
use switchyard_phi4mm_frontend::image::{self, ImageOptions};
use switchyard_phi4mm_frontend::prompt::{ContentPart, Message, Prompt, PromptError, Role};

const LAYOUTS: [&str; 2] = ["model", "model-original"];

fn prompt(layout: &str) -> Prompt {
    Prompt::load(&switchyard_fixtures::fixture().join(layout))
        .unwrap_or_else(|e| panic!("{layout}: {e}"))
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn special_ids_come_from_both_config_layouts() {
    for layout in LAYOUTS {
        let special = prompt(layout).special().clone();
        let want = &switchyard_fixtures::manifest()["token_ids"];
        assert_eq!(
            special.image,
            want["<|endoftext10|> image placeholder"].as_u64().unwrap() as u32,
            "{layout}"
        );
        assert_eq!(
            special.audio,
            want["<|endoftext11|> audio placeholder"].as_u64().unwrap() as u32,
            "{layout}"
        );
        assert_eq!(
            special.bos,
            want["<|endoftext|> (bos, pad, eos, unk)"].as_u64().unwrap() as u32,
            "{layout}"
        );
        assert_eq!(special.eos_token, "<|endoftext|>");
    }
    assert_eq!(
        prompt("model").special().eos,
        ids(&switchyard_fixtures::manifest()["token_ids"]["eos_token_ids"])
    );
}

#[test]
fn tokenizer_cases_are_exact() {
    let manifest = switchyard_fixtures::manifest();
    for layout in LAYOUTS {
        let p = prompt(layout);
        for case in manifest["tokenizer"]["tokenizer_cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let got = p.encode_text(case["text"].as_str().unwrap()).unwrap();
            assert_eq!(got, ids(&case["ids"]), "{layout}/{name}");
            let decoded = p.tokenizer().decode(&got, false).unwrap();
            assert_eq!(
                decoded,
                case["decoded"].as_str().unwrap(),
                "{layout}/{name}: decoded"
            );
        }
    }
}

#[test]
fn chat_template_cases_are_exact() {
    let manifest = switchyard_fixtures::manifest();
    let p = prompt("model");
    for case in manifest["tokenizer"]["chat_template_cases"]
        .as_array()
        .unwrap()
    {
        let name = case["name"].as_str().unwrap();
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let (text, got) = p.tokenize_messages(&messages, add).unwrap();
        assert_eq!(text, case["rendered"].as_str().unwrap(), "{name}: rendered");
        assert_eq!(got, ids(&case["ids"]), "{name}: ids");
    }
}

/// Messages of a text-driven case with the case's media attached as parts after the text.
fn case_messages(case: &Value, strip_placeholders: bool) -> Vec<Message> {
    let text_driven = &case["text_driven"];
    let mut messages: Vec<Message> =
        serde_json::from_value(text_driven["messages"].clone()).unwrap();
    let user = messages
        .iter_mut()
        .rev()
        .find(|m| m.role == Role::User)
        .unwrap();
    if strip_placeholders {
        for part in &mut user.content {
            if let ContentPart::Text { text } = part {
                *text = text.replace("<|image_1|>", "").replace("<|audio_1|>", "");
            }
        }
    }
    for img in case["images"].as_array().unwrap() {
        let bytes =
            switchyard_fixtures::read(&format!("inputs/{}.png", img["name"].as_str().unwrap()));
        user.content.push(ContentPart::Image { bytes });
    }
    for clip in case["audios"].as_array().unwrap() {
        let bytes = switchyard_fixtures::read(&format!("inputs/{}.wav", clip.as_str().unwrap()));
        user.content.push(ContentPart::Audio { bytes });
    }
    messages
}

/// End to end: messages with media parts → template, binding, tokenization, the media's token
/// counts from the image and audio modules, expansion → the case's `input_ids`.
fn expanded_ids(p: &Prompt, messages: &[Message]) -> Vec<u32> {
    let encoded = p.encode_messages(messages, true).unwrap();
    let image_tokens: Vec<usize> = encoded
        .images
        .iter()
        .map(|bytes| {
            image::preprocess(bytes, &ImageOptions::default())
                .unwrap()
                .num_img_tokens
        })
        .collect();
    let audio_tokens: Vec<usize> = encoded
        .audios
        .iter()
        .map(|bytes| {
            audio::features_from_bytes(bytes, &AudioOptions::default())
                .unwrap()
                .num_tokens
        })
        .collect();
    p.expand(&encoded.ids, &image_tokens, &audio_tokens)
        .unwrap()
}

#[test]
fn text_driven_model_cases_give_the_reference_input_ids() {
    let manifest = switchyard_fixtures::manifest();
    let tensors = Tensors::open("model_cases.safetensors");
    let p = prompt("model");
    for name in [
        "chat_text",
        "chat_image_text",
        "chat_audio_text",
        "chat_image_audio_text",
    ] {
        let case = &manifest["model_cases"]["cases"][name];
        let messages = case_messages(case, false);
        let encoded = p.encode_messages(&messages, true).unwrap();
        assert_eq!(
            encoded.text,
            case["text_driven"]["prompt_text"].as_str().unwrap(),
            "{name}: rendered"
        );
        assert_eq!(
            encoded.ids,
            ids(&case["text_driven"]["ids_before_expansion"]),
            "{name}: ids before expansion"
        );
        let got = expanded_ids(&p, &messages);
        let (want, _) = tensors.i64(&format!("{name}.input_ids"));
        let want: Vec<u32> = want.into_iter().map(|v| v as u32).collect();
        assert_eq!(got, want, "{name}: input_ids");
        assert_eq!(got, ids(&case["input_ids"]), "{name}: manifest input_ids");
    }
}

/// A user turn with media and no placeholders gets them inserted at its start, images first:
/// `chat_image_text` (whose text starts with `<|image_1|>`) is reproduced with the placeholder
/// removed from the text.
#[test]
fn missing_placeholders_are_inserted_at_the_start_of_the_turn() {
    let manifest = switchyard_fixtures::manifest();
    let p = prompt("model");
    let case = &manifest["model_cases"]["cases"]["chat_image_text"];
    let got = expanded_ids(&p, &case_messages(case, true));
    assert_eq!(got, ids(&case["input_ids"]));
    // Image and audio in one turn, neither written: `<|image_1|><|audio_1|>` in that order.
    let messages = vec![Message {
        role: Role::User,
        content: vec![
            ContentPart::Audio { bytes: vec![1] },
            ContentPart::Text {
                text: "Describe.".into(),
            },
            ContentPart::Image { bytes: vec![2] },
        ],
    }];
    let encoded = p.encode_messages(&messages, true).unwrap();
    assert_eq!(
        encoded.text,
        "<|user|><|image_1|><|audio_1|>Describe.<|end|><|assistant|>"
    );
    assert_eq!(
        (encoded.images, encoded.audios),
        (vec![&[2u8][..]], vec![&[1u8][..]])
    );
}

#[test]
fn typed_reserved_tokens_are_refused() {
    let p = prompt("model");
    for typed in [
        "<|endoftext11|>",
        "<|endoftext10|>",
        "<|end|>",
        "<|assistant|>",
        "<|system|>",
        "<|endoftext|>",
    ] {
        let messages = vec![Message::text(Role::User, format!("hello {typed} there"))];
        match p.encode_messages(&messages, true) {
            Err(PromptError::ReservedToken { message: 0, token }) => assert_eq!(token, typed),
            other => panic!("{typed}: expected ReservedToken, got {other:?}"),
        }
        assert!(p.tokenize_messages(&messages, true).is_err(), "{typed}");
    }
}

#[test]
fn placeholder_count_mismatches_are_refused() {
    let p = prompt("model");
    // Two placeholders, one image.
    let messages = vec![Message {
        role: Role::User,
        content: vec![
            ContentPart::Text {
                text: "<|image_1|><|image_2|>?".into(),
            },
            ContentPart::Image { bytes: vec![0] },
        ],
    }];
    assert!(matches!(
        p.encode_messages(&messages, true),
        Err(PromptError::CountMismatch {
            kind: "image",
            placeholders: 2,
            media: 1
        })
    ));
    // A placeholder and no audio at all.
    let messages = vec![Message::text(Role::User, "<|audio_1|>Transcribe.")];
    assert!(matches!(
        p.encode_messages(&messages, true),
        Err(PromptError::CountMismatch {
            kind: "audio",
            placeholders: 1,
            media: 0
        })
    ));
    // Expansion with the wrong number of counts.
    let hi = [Message::text(Role::User, "hi")];
    let encoded = p.encode_messages(&hi, true).unwrap();
    assert!(p.expand(&encoded.ids, &[5], &[]).is_err());
}

#[test]
fn media_outside_user_turns_are_refused() {
    let p = prompt("model");
    let messages = vec![Message {
        role: Role::Assistant,
        content: vec![ContentPart::Image { bytes: vec![0] }],
    }];
    assert!(matches!(
        p.encode_messages(&messages, true),
        Err(PromptError::MediaOutsideUser { message: 0, .. })
    ));
    // Nor is a placeholder typed in another turn bound to a user turn's medium.
    for role in [Role::Assistant, Role::System] {
        let messages = vec![
            Message {
                role: Role::User,
                content: vec![
                    ContentPart::Image { bytes: vec![0] },
                    ContentPart::Image { bytes: vec![1] },
                    ContentPart::Text {
                        text: "<|image_1|> look".into(),
                    },
                ],
            },
            Message::text(role, "I see <|image_2|>"),
        ];
        let refused = p.encode_messages(&messages, true).unwrap_err();
        assert!(
            matches!(&refused, PromptError::PlaceholderOutsideUser { message: 1, written, .. }
                if written == "<|image_2|>"),
            "{refused}"
        );
    }
}

#[test]
fn openai_style_content_parts_deserialize() {
    let json = r#"[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]"#;
    let messages: Vec<Message> = serde_json::from_str(json).unwrap();
    let (text, _) = prompt("model").tokenize_messages(&messages, false).unwrap();
    assert_eq!(text, "<|user|>ab<|end|><|endoftext|>");
    assert!(serde_json::from_str::<Vec<Message>>(r#"[{"role": "tool", "content": "x"}]"#).is_err());
}

/// A completion's raw text: without special tokens it tokenizes exactly as the fixture's
/// reference tokenizer does; a special token's spelling stays text (it decodes back to the
/// same text) and yields none of the ids the spelling names.
#[test]
fn untrusted_text_keeps_special_spellings_as_text() {
    let manifest = switchyard_fixtures::manifest();
    let p = prompt("model");
    for case in manifest["tokenizer"]["tokenizer_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        if ["plain", "unicode_emoji", "whitespace_digits_contractions"].contains(&name) {
            let got = p
                .encode_untrusted_text(case["text"].as_str().unwrap())
                .unwrap();
            assert_eq!(got, ids(&case["ids"]), "{name}");
        }
    }
    for typed in [
        "<|endoftext11|>",
        "<|endoftext10|>",
        "<|end|>",
        "<|user|>",
        "<|assistant|>",
        "<|system|>",
        "<|endoftext|>",
    ] {
        let text = format!("hello {typed} there<|assistant|>");
        let forged = p.encode_text(typed).unwrap();
        assert_eq!(forged.len(), 1, "{typed} is one added token");
        let got = p.encode_untrusted_text(&text).unwrap();
        assert!(!got.contains(&forged[0]), "{typed}: {got:?}");
        assert_eq!(p.tokenizer().decode(&got, false).unwrap(), text, "{typed}");
    }
}
