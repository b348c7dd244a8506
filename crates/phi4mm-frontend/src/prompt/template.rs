//! The Phi-4 chat template and placeholder binding.
//!
//! The template is fixed code rather than a Jinja engine: per message
//! `<|role|>` + content + `<|end|>`, then `<|assistant|>` when a generation prompt is wanted,
//! else the eos token (`tokenizer_config.json`'s `chat_template` for Phi-4; no newlines).

use super::error::PromptError;
use super::messages::{ContentPart, Message, Role};
use super::special::{AUDIO_TOKEN, IMAGE_TOKEN};
use regex::Regex;
use std::sync::OnceLock;

fn image_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"<\|image_\d+\|>").expect("valid regex"))
}

fn audio_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"<\|audio_\d+\|>").expect("valid regex"))
}

/// Replaces every `<|image_N|>` by `<|endoftext10|>` and every `<|audio_N|>` by
/// `<|endoftext11|>` (N ignored, as the reference processor does); returns the counts.
pub fn substitute_placeholders(text: &str) -> (String, usize, usize) {
    let n_images = image_re().find_iter(text).count();
    let n_audios = audio_re().find_iter(text).count();
    let text = image_re().replace_all(text, IMAGE_TOKEN);
    let text = audio_re().replace_all(&text, AUDIO_TOKEN).into_owned();
    (text, n_images, n_audios)
}

fn placeholder_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"<\|(image|audio)_\d+\|>").expect("valid regex"))
}

/// One piece of a rendered chat. The tokenizer reads each piece on its own, so nothing in user
/// text can merge with a neighbour (another part, a role marker, a placeholder, the next message)
/// into an added token: a reserved token typed across two parts stays text.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Template text the tokenizer reads as one added token: a role marker, `<|end|>`,
    /// `<|assistant|>` or the eos token.
    Marker(&'static str),
    /// The eos token of the checkpoint (a marker whose text comes from its config).
    Eos,
    /// A media placeholder as written (`<|image_2|>`) or inserted; it stands for the image or
    /// audio placeholder token.
    Placeholder { image: bool, written: String },
    /// User content between markers and placeholders: one message's text parts joined.
    Text { message: usize, text: String },
}

/// Rendered chat with its media in order.
pub struct Bound<'a> {
    /// The rendered template with `<|image_N|>` / `<|audio_N|>` (before substitution).
    pub text: String,
    /// The same chat as pieces, in order; their texts concatenate to `text`.
    pub pieces: Vec<Piece>,
    pub images: Vec<&'a [u8]>,
    pub audios: Vec<&'a [u8]>,
}

/// Renders the template; a user turn with media of a kind but no placeholder of that kind gets
/// one placeholder per medium at its start (images first), numbered by position in the request.
pub fn bind_and_render<'a>(
    messages: &'a [Message],
    add_generation_prompt: bool,
    eos_token: &str,
) -> Result<Bound<'a>, PromptError> {
    let mut pieces = Vec::new();
    let mut images = Vec::new();
    let mut audios = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let mut text = String::new();
        let (mut turn_images, mut turn_audios) = (Vec::new(), Vec::new());
        for part in &message.content {
            match part {
                ContentPart::Text { text: t } => text.push_str(t),
                ContentPart::Image { bytes } => turn_images.push(bytes.as_slice()),
                ContentPart::Audio { bytes } => turn_audios.push(bytes.as_slice()),
            }
        }
        if message.role != Role::User {
            if !(turn_images.is_empty() && turn_audios.is_empty()) {
                return Err(PromptError::MediaOutsideUser {
                    message: index,
                    role: message.role.as_str(),
                });
            }
            // Typed in another turn, a placeholder would bind a user turn's medium there.
            if let Some(written) = placeholder_re().find(&text) {
                return Err(PromptError::PlaceholderOutsideUser {
                    message: index,
                    role: message.role.as_str(),
                    written: written.as_str().to_owned(),
                });
            }
        }
        pieces.push(Piece::Marker(message.role.marker()));
        if !turn_images.is_empty() && !image_re().is_match(&text) {
            for k in 0..turn_images.len() {
                pieces.push(Piece::Placeholder {
                    image: true,
                    written: format!("<|image_{}|>", images.len() + k + 1),
                });
            }
        }
        if !turn_audios.is_empty() && !audio_re().is_match(&text) {
            for k in 0..turn_audios.len() {
                pieces.push(Piece::Placeholder {
                    image: false,
                    written: format!("<|audio_{}|>", audios.len() + k + 1),
                });
            }
        }
        images.extend(turn_images);
        audios.extend(turn_audios);
        // Placeholders typed in the content (N ignored); the text between them stays text.
        let mut last = 0;
        for m in placeholder_re().captures_iter(&text) {
            let whole = m.get(0).expect("group 0 always matches");
            if whole.start() > last {
                pieces.push(Piece::Text {
                    message: index,
                    text: text[last..whole.start()].to_owned(),
                });
            }
            pieces.push(Piece::Placeholder {
                image: &m[1] == "image",
                written: whole.as_str().to_owned(),
            });
            last = whole.end();
        }
        if last < text.len() {
            pieces.push(Piece::Text {
                message: index,
                text: text[last..].to_owned(),
            });
        }
        pieces.push(Piece::Marker("<|end|>"));
    }
    pieces.push(if add_generation_prompt {
        Piece::Marker("<|assistant|>")
    } else {
        Piece::Eos
    });
    let mut text = String::new();
    for piece in &pieces {
        text.push_str(match piece {
            Piece::Marker(m) => m,
            Piece::Eos => eos_token,
            Piece::Placeholder { written, .. } => written,
            Piece::Text { text, .. } => text,
        });
    }
    Ok(Bound {
        text,
        pieces,
        images,
        audios,
    })
}
