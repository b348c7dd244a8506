//! The Phi-4 chat template and placeholder binding.
//!
//! The template is fixed code rather than a Jinja engine: per message
//! `<|role|>` + content + `<|end|>`, then `<|assistant|>` when a generation prompt is wanted,
//! else the eos token (`tokenizer_config.json`'s `chat_template` for Phi-4; no newlines).

use super::messages::{ContentPart, Message, Role};
use super::special::{AUDIO_TOKEN, IMAGE_TOKEN};
use super::PromptError;
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

/// Rendered chat with its media in order.
pub struct Bound<'a> {
    pub text: String,
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
    let mut out = String::new();
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
        if message.role != Role::User && !(turn_images.is_empty() && turn_audios.is_empty()) {
            return Err(PromptError::MediaOutsideUser {
                message: index,
                role: message.role.as_str(),
            });
        }
        let mut prefix = String::new();
        if !turn_images.is_empty() && !image_re().is_match(&text) {
            for k in 0..turn_images.len() {
                prefix.push_str(&format!("<|image_{}|>", images.len() + k + 1));
            }
        }
        if !turn_audios.is_empty() && !audio_re().is_match(&text) {
            for k in 0..turn_audios.len() {
                prefix.push_str(&format!("<|audio_{}|>", audios.len() + k + 1));
            }
        }
        images.extend(turn_images);
        audios.extend(turn_audios);
        out.push_str("<|");
        out.push_str(message.role.as_str());
        out.push_str("|>");
        out.push_str(&prefix);
        out.push_str(&text);
        out.push_str("<|end|>");
    }
    out.push_str(if add_generation_prompt {
        "<|assistant|>"
    } else {
        eos_token
    });
    Ok(Bound {
        text: out,
        images,
        audios,
    })
}
