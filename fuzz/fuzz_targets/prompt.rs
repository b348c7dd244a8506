//! Arbitrary text through the chat template, placeholder binding, tokenization and expansion,
//! and arbitrary JSON through the message parser. Each turn's text is cut into two parts, and
//! the ids must hold exactly one `<|end|>` per turn: no join of parts forges one.
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
    // Split into turns on '\n', each cut in two at its middle character boundary; media parts
    // according to the text's own markers.
    let messages: Vec<Message> = text
        .split('\n')
        .enumerate()
        .map(|(i, line)| {
            let role = [Role::System, Role::User, Role::Assistant][i % 3];
            let cut = (line.len() / 2..=line.len()).find(|&k| line.is_char_boundary(k)).unwrap_or(0);
            let (a, b) = line.split_at(cut);
            let mut content =
                vec![ContentPart::Text { text: a.to_string() }, ContentPart::Text { text: b.to_string() }];
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
        let end = p.tokenizer().token_to_id("<|end|>").expect("fixture has <|end|>");
        assert_eq!(encoded.ids.iter().filter(|&&id| id == end).count(), messages.len(), "{:?}", encoded.ids);
        let images: Vec<usize> = encoded.images.iter().map(|_| 3).collect();
        let audios: Vec<usize> = encoded.audios.iter().map(|_| 2).collect();
        let expanded = p.expand(&encoded.ids, &images, &audios).expect("counts were validated");
        assert_eq!(expanded.len(), encoded.ids.len() + 2 * images.len() + audios.len());
    }
});
