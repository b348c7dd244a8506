//! Arbitrary text through the chat template, placeholder binding, tokenization and expansion,
//! and arbitrary JSON through the message parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use switchyard_phi4mm_frontend::prompt::{ContentPart, Message, Prompt, Role};

fn prompt() -> &'static Prompt {
    static PROMPT: OnceLock<Prompt> = OnceLock::new();
    PROMPT.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/phi4mm-tiny/model");
        Prompt::load(&dir).expect("fixture tokenizer loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let p = prompt();
    if let Ok(messages) = serde_json::from_slice::<Vec<Message>>(data) {
        let _ = p.tokenize_messages(&messages, true);
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = p.encode_text(text);
    // Split into turns on '\n'; media parts according to the text's own markers.
    let messages: Vec<Message> = text
        .split('\n')
        .enumerate()
        .map(|(i, line)| {
            let role = [Role::System, Role::User, Role::Assistant][i % 3];
            let mut content = vec![ContentPart::Text { text: line.to_string() }];
            if role == Role::User {
                for _ in 0..line.matches('#').count().min(4) {
                    content.push(ContentPart::Image { bytes: vec![0] });
                }
                for _ in 0..line.matches('@').count().min(4) {
                    content.push(ContentPart::Audio { bytes: vec![1] });
                }
            }
            Message { role, content }
        })
        .collect();
    if let Ok(encoded) = p.encode_messages(&messages, text.len() % 2 == 0) {
        let images: Vec<usize> = encoded.images.iter().map(|_| 3).collect();
        let audios: Vec<usize> = encoded.audios.iter().map(|_| 2).collect();
        let expanded = p.expand(&encoded.ids, &images, &audios).expect("counts were validated");
        assert_eq!(expanded.len(), encoded.ids.len() + 2 * images.len() + audios.len());
    }
});
