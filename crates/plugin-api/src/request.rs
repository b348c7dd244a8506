use crate::manifest::{Endpoint, Modality};
use abi_stable::{
    std_types::{ROption, RString, RVec},
    StableAbi,
};
use serde::{Deserialize, Serialize};

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
///
/// It travels inside the request, as the value of [`Prompt::KEY`] in `model_options`, and the
/// export glue takes it out again before the plugin sees the request. 2.1 changes no layout:
/// abi_stable refuses a loader whose `Model` vtable has more methods than the library's, so a
/// new method would lock every 2.0 plugin out of this host (see "Versioning" in
/// docs/plugin-abi.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text from the client. It is untrusted: a model must tokenize it so that it yields no
    /// reserved token (a special token's spelling stays text) and refuse what still does.
    Text(String),
    /// Token ids of the model's vocabulary. The model checks each one against its vocabulary
    /// and refuses ids it cannot take without more input (a media placeholder, say).
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The `model_options` key that carries a completion's prompt. Keys under `switchyard.` are
    /// the host's: it refuses them in a client's `model_options`.
    pub const KEY: &'static str = "switchyard.prompt";

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

    /// The request as a completion of `prompt`: the prompt goes into `model_options` under
    /// [`Prompt::KEY`], beside the client's options. The host's side of [`Request::take_prompt`].
    pub fn with_prompt(mut self, prompt: &Prompt) -> Result<Self, String> {
        let mut options = self.model_options_json()?.unwrap_or_default();
        if options.contains_key(Prompt::KEY) {
            return Err(format!(
                "model_options.{}: the key is reserved",
                Prompt::KEY
            ));
        }
        let value = serde_json::to_value(prompt).map_err(|e| e.to_string())?;
        options.insert(Prompt::KEY.into(), value);
        self.model_options = serde_json::Value::Object(options).to_string().into();
        Ok(self)
    }

    /// Takes a completion's prompt out of `model_options` (see [`Prompt`]), leaving the
    /// client's options as they were sent; `Ok(None)` for a chat or a transcription. A prompt
    /// beside messages is refused: a request is one or the other.
    pub fn take_prompt(&mut self) -> Result<Option<Prompt>, String> {
        // Most requests carry no options at all; only those that name the key are parsed.
        if !self.model_options.contains(Prompt::KEY) {
            return Ok(None);
        }
        let Some(mut options) = self.model_options_json()? else {
            return Ok(None);
        };
        let Some(value) = options.remove(Prompt::KEY) else {
            return Ok(None);
        };
        if !self.messages.is_empty() {
            return Err(format!(
                "model_options.{}: the key is reserved",
                Prompt::KEY
            ));
        }
        let prompt = serde_json::from_value(value)
            .map_err(|e| format!("model_options.{}: {e}", Prompt::KEY))?;
        self.model_options = if options.is_empty() {
            RString::new()
        } else {
            serde_json::Value::Object(options).to_string().into()
        };
        Ok(Some(prompt))
    }

    pub fn modality(&self) -> Modality {
        let parts = || self.messages.iter().flat_map(|m| m.parts.iter());
        let has_image = parts().any(|p| matches!(p, Part::Image(_)));
        let has_audio = parts().any(|p| matches!(p, Part::Audio { .. }));
        Modality::of(has_image, has_audio)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(options: &str) -> Request {
        let mut request = Request::new(7, Endpoint::Chat, Vec::new());
        request.model_options = options.into();
        request
    }

    #[test]
    fn a_prompt_travels_in_model_options_and_leaves_the_clients_options_as_sent() {
        for prompt in [Prompt::Text("Once".into()), Prompt::Tokens(vec![1, 2, 3])] {
            for options in ["", r#"{"adapter":"speech"}"#] {
                let mut sent = completion(options).with_prompt(&prompt).unwrap();
                assert!(sent.model_options.contains(Prompt::KEY));
                assert_eq!(sent.take_prompt().unwrap(), Some(prompt.clone()));
                assert_eq!(sent.model_options.as_str(), options);
                assert_eq!(sent.take_prompt().unwrap(), None);
            }
        }
    }

    #[test]
    fn the_prompt_key_is_refused_from_a_client_and_beside_messages() {
        let taken =
            completion(r#"{"switchyard.prompt":"x"}"#).with_prompt(&Prompt::Text("y".into()));
        assert!(taken.unwrap_err().contains("reserved"));
        let mut chat = Request::new(7, Endpoint::Chat, vec![Message::text(Role::User, "hi")]);
        chat.model_options = r#"{"switchyard.prompt":"x"}"#.into();
        assert!(chat.take_prompt().unwrap_err().contains("reserved"));
        let mut bad = completion(r#"{"switchyard.prompt":{"not":"a prompt"}}"#);
        assert!(bad.take_prompt().unwrap_err().contains("switchyard.prompt"));
    }
}
