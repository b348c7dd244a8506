use crate::manifest::{Endpoint, Modality};
use abi_stable::{
    std_types::{ROption, RString, RVec},
    StableAbi,
};

#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

/// One part of a chat message. Media travel as their encoded bytes; decoding them (and refusing
/// bad ones) is the plugin's job, since only it knows what its model needs.
#[repr(C, u8)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub enum Part {
    Text(RString),
    /// Encoded image bytes (PNG, JPEG, WebP, GIF, ...).
    Image(RVec<u8>),
    /// Encoded audio bytes and the client's format hint (`wav`, `mp3`, ... or empty).
    Audio {
        data: RVec<u8>,
        format: RString,
    },
}

#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub parts: RVec<Part>,
}

impl Message {
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            parts: vec![Part::Text(RString::from(text.into()))].into(),
        }
    }
}

/// Sampling parameters. `temperature == 0` means greedy.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub max_tokens: ROption<u32>,
    pub temperature: f32,
    pub top_p: f32,
    /// 0 means no top-k cut.
    pub top_k: u32,
    pub seed: ROption<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_tokens: ROption::RNone,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: ROption::RNone,
        }
    }
}

/// One request handed to a model instance.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Request {
    /// Unique within the host process; used by [`crate::PluginModel::cancel`].
    pub id: u64,
    pub endpoint: Endpoint,
    pub messages: RVec<Message>,
    pub sampling: SamplingParams,
    /// Stop strings: generation ends before the first occurrence of any of them.
    pub stop: RVec<RString>,
    /// Milliseconds since the Unix epoch after which the plugin should give up, if set.
    pub deadline_unix_ms: ROption<u64>,
}

impl Request {
    pub fn modality(&self) -> Modality {
        let parts = || self.messages.iter().flat_map(|m| m.parts.iter());
        let has_image = parts().any(|p| matches!(p, Part::Image(_)));
        let has_audio = parts().any(|p| matches!(p, Part::Audio { .. }));
        Modality::of(has_image, has_audio)
    }
}
