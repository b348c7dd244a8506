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

/// The prompt of a completion (`/v1/completions`, API 2.1), handed to
/// [`crate::PluginModel::submit_prompt`] beside a [`Request`] whose `messages` are empty: the
/// model reads it raw, with no chat template.
#[repr(C, u8)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text from the client. It is untrusted: a model must tokenize it so that it yields no
    /// reserved token (a special token's spelling stays text) and refuse what still does.
    Text(RString),
    /// Token ids of the model's vocabulary. The model checks each one against its vocabulary
    /// and refuses ids it cannot take without more input (a media placeholder, say).
    Tokens(RVec<u32>),
}

impl Prompt {
    /// What the prompt weighs against `max_prompt_bytes`: its text's bytes, or 4 bytes per id
    /// (the size of an id, and about a token's text in a large vocabulary).
    pub fn weight_bytes(&self) -> usize {
        match self {
            Self::Text(text) => text.len(),
            Self::Tokens(ids) => ids.len().saturating_mul(4),
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
    /// Log probabilities wanted with every token: `RNone` = none; `RSome(k)` = the generated
    /// token's and the `k` most likely ones (`k` ≤ [`Request::MAX_TOP_LOGPROBS`]). A model that
    /// cannot report them refuses the request (`Unsupported`).
    pub logprobs: ROption<u8>,
    /// Model-specific options: a JSON object as text (the request body's `model_options`), or
    /// empty when the client sent none. The host passes it verbatim; the plugin defines and
    /// validates its keys and refuses unknown ones (`InvalidRequest`).
    pub model_options: RString,
}

impl Request {
    /// The most alternatives a request may ask for per token (OpenAI's bound).
    pub const MAX_TOP_LOGPROBS: u8 = 20;

    /// A request with no sampling options, stops, deadline, log probabilities or model options.
    pub fn new(id: u64, endpoint: Endpoint, messages: Vec<Message>) -> Self {
        Self {
            id,
            endpoint,
            messages: messages.into(),
            sampling: SamplingParams::default(),
            stop: RVec::new(),
            deadline_unix_ms: ROption::RNone,
            logprobs: ROption::RNone,
            model_options: RString::new(),
        }
    }

    /// The model options as a JSON object; `Ok(None)` when there are none.
    pub fn model_options_json(
        &self,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>, String> {
        let text = self.model_options.as_str().trim();
        if text.is_empty() {
            return Ok(None);
        }
        match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => Ok(Some(map)),
            Ok(_) => Err("model_options must be a JSON object".into()),
            Err(e) => Err(format!("model_options is not valid JSON: {e}")),
        }
    }

    pub fn modality(&self) -> Modality {
        let parts = || self.messages.iter().flat_map(|m| m.parts.iter());
        let has_image = parts().any(|p| matches!(p, Part::Image(_)));
        let has_audio = parts().any(|p| matches!(p, Part::Audio { .. }));
        Modality::of(has_image, has_audio)
    }
}
