//! Chat messages with ordered text and media parts.

use serde::{Deserialize, Serialize};

/// Chat roles of the Phi-4 template.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// The name inside the role marker (`<|user|>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }

    /// The role marker that opens a turn of this role.
    pub fn marker(self) -> &'static str {
        match self {
            Role::System => "<|system|>",
            Role::User => "<|user|>",
            Role::Assistant => "<|assistant|>",
        }
    }
}

/// One part of a message, in order. Media parts carry their encoded bytes; the prompt only
/// binds them to placeholders, the audio / image modules decode them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    Image { bytes: Vec<u8> },
    Audio { bytes: Vec<u8> },
}

/// A chat message. Deserializes from OpenAI-style JSON where `content` is a string or a list of
/// parts (`{"type": "text", "text": …}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    #[serde(deserialize_with = "content_from_json")]
    pub content: Vec<ContentPart>,
}

impl Message {
    /// A text-only message.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: vec![ContentPart::Text { text: text.into() }],
        }
    }
}

fn content_from_json<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ContentPart>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<ContentPart>),
    }
    Ok(match Content::deserialize(d)? {
        Content::Text(text) => vec![ContentPart::Text { text }],
        Content::Parts(parts) => parts,
    })
}
