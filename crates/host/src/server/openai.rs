//! OpenAI request bodies and their translation into plugin requests.

use super::{error::ApiError, logprobs::LogprobsFormat};
use crate::instance::Submission;
use abi_stable::std_types::{ROption, RString, RVec};
use base64::Engine;
use serde::Deserialize;
use switchyard_plugin_api::{Endpoint, Message, Part, Prompt, Request, Role, SamplingParams};

/// The prefix of the `model_options` keys the host itself writes (a completion's prompt,
/// `Prompt::KEY`); a client's options may not name them.
const HOST_OPTIONS: &str = "switchyard.";

/// `POST /v1/chat/completions`. Unknown fields are accepted and ignored, as OpenAI clients send
/// many optional ones.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub generation: Generation,
    pub max_completion_tokens: Option<u32>,
    /// Return the log probability of every generated token.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// With `logprobs`: this many most likely alternatives per token (0–20).
    pub top_logprobs: Option<u32>,
}

/// `POST /v1/completions` (OpenAI's legacy completions): one prompt, as text or token ids.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: PromptField,
    #[serde(flatten)]
    pub generation: Generation,
    /// The legacy integer form: each token's log probability and this many alternatives.
    pub logprobs: Option<u32>,
    /// Only `false`: the answer never repeats the prompt.
    #[serde(default, deserialize_with = "null_is_false")]
    pub echo: bool,
    /// Only 1 (or absent): one completion per prompt.
    pub best_of: Option<u32>,
    /// Only absent: `suffix` is an insertion prompt, which no model here takes.
    pub suffix: Option<String>,
}

/// A completion's `prompt`: one string, one array of token ids, or any other array (OpenAI's
/// batches of strings or of id arrays), which is refused by name rather than by a parse error.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
    Batch(Vec<serde_json::Value>),
}

/// What chat and completions requests share: streaming, sampling, stops and model options,
/// each checked once in [`Generation::to_request`].
#[derive(Debug, Deserialize)]
pub struct Generation {
    #[serde(default, deserialize_with = "null_is_false")]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not in OpenAI's API, but common in compatible servers.
    pub top_k: Option<u32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<u32>,
    /// vLLM's extension: the `token` fields of `logprobs` read `token_id:<id>` (ids are exact;
    /// the bytes of one token need not be text).
    #[serde(default, deserialize_with = "null_is_false")]
    pub return_tokens_as_token_ids: bool,
    /// Not in OpenAI's API: options for the model that serves the request, passed to its plugin
    /// verbatim (a JSON object; each model documents its keys and refuses unknown ones).
    pub model_options: Option<serde_json::Value>,
    /// OpenAI fields that change what an answer must be, which no model here honours: read
    /// only to refuse them by name (`Generation::refuse_unsupported`) rather than answer
    /// as if they were not there.
    #[serde(flatten)]
    pub unsupported: UnsupportedFields,
}

/// See [`Generation::unsupported`]: whether each field asks for something (`true`), or holds
/// its neutral value (null, `{"type": "text"}`, no tools, `"none"` or `"auto"`, no bias, a zero
/// penalty), which clients send by default. Flags, not the values: this struct is moved with
/// every request, and a value each made it twice the size.
#[derive(Debug, Default, Deserialize)]
pub struct UnsupportedFields {
    #[serde(default, deserialize_with = "asks_for_a_format")]
    response_format: bool,
    #[serde(default, deserialize_with = "asks_for_something")]
    tools: bool,
    #[serde(default, deserialize_with = "asks_for_a_tool")]
    tool_choice: bool,
    #[serde(default, deserialize_with = "asks_for_something")]
    functions: bool,
    #[serde(default, deserialize_with = "asks_for_a_tool")]
    function_call: bool,
    #[serde(default, deserialize_with = "asks_for_something")]
    logit_bias: bool,
    #[serde(default, deserialize_with = "asks_for_a_penalty")]
    presence_penalty: bool,
    #[serde(default, deserialize_with = "asks_for_a_penalty")]
    frequency_penalty: bool,
}

/// Anything but null, `[]` or `{}`.
fn asks_for_something<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    use serde_json::Value;
    Ok(match Value::deserialize(d)? {
        Value::Null => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    })
}

/// Anything but null, `"none"` or `"auto"` (with no tools, "auto" chooses none).
fn asks_for_a_tool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    use serde_json::Value;
    Ok(match Value::deserialize(d)? {
        Value::Null => false,
        Value::String(s) => s != "none" && s != "auto",
        _ => true,
    })
}

/// Any format but null or `{"type": "text"}`.
fn asks_for_a_format<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    use serde_json::Value;
    Ok(match Value::deserialize(d)? {
        Value::Null => false,
        format => format.get("type") != Some(&Value::from("text")),
    })
}

/// A penalty other than null or 0.
fn asks_for_a_penalty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.is_some_and(|p| p != 0.0))
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default, deserialize_with = "null_is_false")]
    pub include_usage: bool,
}

/// OpenAI types its flags `boolean | null`, null meaning the default, false.
fn null_is_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// A message's `content`: a string, or a list of parts. Read by hand rather than as an untagged
/// enum, whose one error for any bad part ("data did not match any variant") named neither the
/// part's unknown type nor its missing field.
#[derive(Debug)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Content;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a list of content parts")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Content, E> {
                Ok(Content::Text(text.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Content, E> {
                Ok(Content::Text(text))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Content, A::Error> {
                Vec::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(Content::Parts)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
pub enum ContentPart {
    #[serde(rename = "text")]
    Text { text: String },
    #[serde(rename = "image_url")]
    ImageUrl { image_url: ImageUrl },
    #[serde(rename = "input_audio")]
    InputAudio { input_audio: InputAudio },
}

#[derive(Debug, Deserialize)]
pub struct ImageUrl {
    pub url: String,
}

#[derive(Debug, Deserialize)]
pub struct InputAudio {
    pub data: String,
    #[serde(default)]
    pub format: String,
}

impl Generation {
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// How to write `logprobs`, when the request asked for them.
    pub fn logprobs_format(&self, wanted: bool) -> Option<LogprobsFormat> {
        wanted.then_some(LogprobsFormat {
            token_ids: self.return_tokens_as_token_ids,
        })
    }

    /// The plugin request around `messages`: the sampling fields, stops and model options,
    /// checked; `logprobs` as [`Request::logprobs`]. Errors name the offending field.
    fn to_request(
        &self,
        id: u64,
        messages: Vec<Message>,
        max_tokens: Option<u32>,
        logprobs: Option<u8>,
    ) -> Result<Request, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
        }
        self.refuse_unsupported()?;
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::invalid_param(
                "stream_options",
                "only allowed with stream: true",
            ));
        }
        // The budget used is `max_completion_tokens` when a chat sets it, else `max_tokens`.
        let (budget_field, budget) = match max_tokens {
            Some(value) => ("max_completion_tokens", Some(value)),
            None => ("max_tokens", self.max_tokens),
        };
        if budget == Some(0) {
            return Err(ApiError::invalid_param(budget_field, "must be at least 1"));
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid_param(
                "temperature",
                "must be between 0 and 2",
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid_param("top_p", "must be in (0, 1]"));
        }
        let model_options = match &self.model_options {
            None | Some(serde_json::Value::Null) => RString::new(),
            Some(serde_json::Value::Object(options))
                if options.keys().any(|k| k.starts_with(HOST_OPTIONS)) =>
            {
                return Err(ApiError::invalid_param(
                    "model_options",
                    format!("keys under {HOST_OPTIONS} are the host's own"),
                ))
            }
            Some(v @ serde_json::Value::Object(_)) => v.to_string().into(),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "model_options",
                    "must be a JSON object",
                ))
            }
        };
        let stop: Vec<RString> = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.as_str().into()],
            Some(Stop::Many(v)) => v.iter().map(|s| s.as_str().into()).collect(),
        };
        Ok(Request {
            id,
            endpoint: Endpoint::Chat,
            messages: messages.into(),
            sampling: SamplingParams {
                max_tokens: max_tokens
                    .or(self.max_tokens)
                    .map_or(ROption::RNone, ROption::RSome),
                temperature,
                top_p,
                top_k: self.top_k.unwrap_or(0),
                seed: self.seed.map_or(ROption::RNone, ROption::RSome),
            },
            stop: stop.into(),
            deadline_unix_ms: ROption::RNone,
            logprobs: logprobs.map_or(ROption::RNone, ROption::RSome),
            model_options,
        })
    }
}

impl Generation {
    /// Refuses the OpenAI fields that would change the answer's form or its sampling in ways no
    /// model here implements (structured output, tool calls, logit bias, penalties), naming
    /// each: an answer that ignored them would be wrong, not merely plain.
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let f = &self.unsupported;
        let refusals = [
            (
                f.response_format,
                "response_format",
                "only {\"type\": \"text\"} is supported: no model here constrains its output \
                 to JSON or to a schema",
            ),
            (
                f.tools,
                "tools",
                "tool and function calling are not supported",
            ),
            (
                f.functions,
                "functions",
                "tool and function calling are not supported",
            ),
            (
                f.tool_choice,
                "tool_choice",
                "tool and function calling are not supported (only \"none\" or \"auto\")",
            ),
            (
                f.function_call,
                "function_call",
                "tool and function calling are not supported (only \"none\" or \"auto\")",
            ),
            (f.logit_bias, "logit_bias", "logit_bias is not supported"),
            (
                f.presence_penalty,
                "presence_penalty",
                "only 0 is supported: no model here penalises repeated tokens",
            ),
            (
                f.frequency_penalty,
                "frequency_penalty",
                "only 0 is supported: no model here penalises repeated tokens",
            ),
        ];
        match refusals.into_iter().find(|(asked, ..)| *asked) {
            Some((_, param, message)) => Err(ApiError::invalid_param(param, message)),
            None => Ok(()),
        }
    }
}

/// `k` alternatives per token, within [`Request::MAX_TOP_LOGPROBS`]; `param` names the field.
fn top_logprobs(param: &str, k: Option<u32>) -> Result<Option<u8>, ApiError> {
    let max = Request::MAX_TOP_LOGPROBS;
    match k {
        None => Ok(None),
        Some(k) if k <= max as u32 => Ok(Some(k as u8)),
        Some(_) => Err(ApiError::invalid_param(
            param,
            format!("must be between 0 and {max}"),
        )),
    }
}

impl ChatRequest {
    pub fn logprobs_format(&self) -> Option<LogprobsFormat> {
        self.generation
            .logprobs_format(self.logprobs.unwrap_or(false))
    }

    /// Builds the plugin request, decoding media; errors name the offending field.
    pub fn to_plugin(&self, id: u64) -> Result<Request, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param(
                "messages",
                "at least one message is required",
            ));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, message) in self.messages.iter().enumerate() {
            let role = match message.role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].role"),
                        format!(
                            "role {} is not supported (system, developer, user, assistant)",
                            super::error::shown(other)
                        ),
                    ))
                }
            };
            let mut parts = Vec::new();
            match &message.content {
                // An assistant turn may have no content (OpenAI's tool calls); a client's may not.
                None if role != Role::Assistant => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].content"),
                        "content is required (a string or a list of parts)",
                    ))
                }
                None => {}
                Some(Content::Text(text)) => parts.push(Part::Text(text.as_str().into())),
                Some(Content::Parts(list)) => {
                    for (j, part) in list.iter().enumerate() {
                        let param = format!("messages[{i}].content[{j}]");
                        parts.push(match part {
                            ContentPart::Text { text } => Part::Text(text.as_str().into()),
                            ContentPart::ImageUrl { image_url } => {
                                Part::Image(decode_data_uri(&image_url.url, &param)?.into())
                            }
                            ContentPart::InputAudio { input_audio } => Part::Audio {
                                data: decode_audio_data(&input_audio.data, &param)?.into(),
                                format: input_audio.format.as_str().into(),
                            },
                        });
                    }
                }
            }
            if role != Role::User && parts.iter().any(|p| !matches!(p, Part::Text(_))) {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].content"),
                    "images and audio are accepted in user messages only",
                ));
            }
            messages.push(Message {
                role,
                parts: RVec::from(parts),
            });
        }
        let logprobs = self.logprobs_wanted()?;
        self.generation
            .to_request(id, messages, self.max_completion_tokens, logprobs)
    }

    /// `None` = no log probabilities; `Some(k)` = each token's and its `k` best alternatives.
    fn logprobs_wanted(&self) -> Result<Option<u8>, ApiError> {
        let top = top_logprobs("top_logprobs", self.top_logprobs)?;
        match (self.logprobs.unwrap_or(false), top) {
            (true, top) => Ok(Some(top.unwrap_or(0))),
            (false, Some(_)) => Err(ApiError::invalid_param(
                "top_logprobs",
                "needs \"logprobs\": true",
            )),
            (false, None) => Ok(None),
        }
    }
}

impl CompletionRequest {
    pub fn logprobs_format(&self) -> Option<LogprobsFormat> {
        self.generation.logprobs_format(self.logprobs.is_some())
    }

    /// The plugin request (no messages) and the raw prompt; errors name the offending field.
    pub fn to_plugin(&self, id: u64) -> Result<Submission, ApiError> {
        let prompt = match &self.prompt {
            PromptField::Text(text) => Prompt::Text(text.as_str().into()),
            PromptField::Tokens(ids) if ids.is_empty() => {
                return Err(ApiError::invalid_param("prompt", "the prompt is empty"))
            }
            PromptField::Tokens(ids) => Prompt::Tokens(ids.clone()),
            // Not strings nor arrays: an array of ids with one that is no token id.
            PromptField::Batch(items) if items.iter().all(|v| !(v.is_string() || v.is_array())) => {
                let (at, bad) = items
                    .iter()
                    .enumerate()
                    .find(|(_, v)| v.as_u64().is_none_or(|id| id > u64::from(u32::MAX)))
                    .expect("an array of u32 ids parses as Tokens");
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!(
                        "prompt[{at}] = {} is not a token id (an integer from 0 to 2^32 - 1)",
                        // A scalar's text is short (numbers parse to 64 bits); an object may
                        // be of any size.
                        match bad {
                            serde_json::Value::Object(_) => "{…}".to_string(),
                            scalar => scalar.to_string(),
                        }
                    ),
                ));
            }
            PromptField::Batch(prompts) => {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!(
                        "a batch of {} prompts is not supported: send one prompt (a string or \
                         an array of token ids) per request",
                        prompts.len()
                    ),
                ))
            }
        };
        if self.echo {
            return Err(ApiError::invalid_param(
                "echo",
                "echo: true is not supported (the answer never repeats the prompt)",
            ));
        }
        if self.best_of.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid_param(
                "best_of",
                "only best_of = 1 is supported",
            ));
        }
        if self.suffix.is_some() {
            return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
        }
        let logprobs = top_logprobs("logprobs", self.logprobs)?;
        let request = self.generation.to_request(id, Vec::new(), None, logprobs)?;
        Ok(Submission {
            prompt: Some(prompt),
            ..Submission::from(request)
        })
    }
}

/// `data:[<mime>][;base64],<payload>`. Only base64 payloads are meaningful for media; remote URLs
/// are refused because the server fetches nothing on a client's behalf.
fn decode_data_uri(url: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    // Schemes and the `base64` token are case-insensitive (RFC 3986, RFC 2397).
    let rest = url
        .get(..5)
        .filter(|scheme| scheme.eq_ignore_ascii_case("data:"))
        .map(|_| &url[5..]);
    let Some(rest) = rest else {
        return Err(ApiError::invalid_param(
            param,
            "image_url must be a data: URI (data:image/png;base64,...); remote URLs are not fetched",
        ));
    };
    let Some((meta, payload)) = rest.split_once(',') else {
        return Err(ApiError::invalid_param(
            param,
            "malformed data: URI (no comma)",
        ));
    };
    let base64 = meta
        .len()
        .checked_sub(7)
        .and_then(|at| meta.get(at..))
        .is_some_and(|end| end.eq_ignore_ascii_case(";base64"));
    if !base64 {
        return Err(ApiError::invalid_param(
            param,
            "data: URI must be base64-encoded",
        ));
    }
    decode_base64(payload, param)
}

/// `input_audio.data`: plain base64, as OpenAI's API has it. A `data:` URI there (what
/// `image_url` takes) is refused saying so, rather than as base64 with a bad symbol.
fn decode_audio_data(payload: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    if payload
        .get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("data:"))
    {
        return Err(ApiError::invalid_param(
            param,
            "input_audio.data takes the clip as plain base64, not as a data: URI",
        ));
    }
    decode_base64(payload, param)
}

fn decode_base64(payload: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    let trimmed: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(trimmed.as_bytes())
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed.as_bytes()))
        .map_err(|e| ApiError::invalid_param(param, format!("invalid base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Request, ApiError> {
        serde_json::from_str::<ChatRequest>(json)
            .unwrap()
            .to_plugin(7)
    }

    #[test]
    fn audio_data_is_plain_base64_and_a_data_uri_there_is_named() {
        assert_eq!(decode_audio_data("AAEC", "p").unwrap(), vec![0u8, 1, 2]);
        let err = decode_audio_data("data:audio/wav;base64,AAEC", "p").unwrap_err();
        assert!(
            err.message.contains("not as a data: URI"),
            "{}",
            err.message
        );
    }

    #[test]
    fn data_uris_are_case_insensitive_in_scheme_and_encoding() {
        for url in ["DATA:image/png;BASE64,AAEC", "Data:image/png;Base64,AAEC"] {
            assert_eq!(decode_data_uri(url, "p").unwrap(), vec![0u8, 1, 2], "{url}");
        }
        assert!(decode_data_uri("https://example.com/a.png", "p").is_err());
        assert!(decode_data_uri("data:image/png,AAEC", "p").is_err());
        assert!(decode_data_uri("dat", "p").is_err());
    }

    #[test]
    fn a_prompt_with_a_value_that_is_no_token_id_names_it() {
        for (prompt, named) in [
            ("[1,2,4294967296]", "prompt[2] = 4294967296"),
            ("[-1]", "prompt[0] = -1"),
            ("[1.5]", "prompt[0] = 1.5"),
            ("[1,2,null]", "prompt[2] = null"),
            (r#"[{"a":"long text"}]"#, "prompt[0] = {…} is not"),
        ] {
            let body = format!(r#"{{"model":"m","prompt":{prompt}}}"#);
            let err = serde_json::from_str::<CompletionRequest>(&body)
                .unwrap()
                .to_plugin(1)
                .unwrap_err();
            assert!(err.message.contains(named), "{prompt}: {}", err.message);
            assert_eq!(err.param.as_deref(), Some("prompt"));
        }
        let batch = r#"{"model":"m","prompt":["a","b"]}"#;
        let err = serde_json::from_str::<CompletionRequest>(batch)
            .unwrap()
            .to_plugin(1)
            .unwrap_err();
        assert!(
            err.message.contains("a batch of 2 prompts"),
            "{}",
            err.message
        );
    }

    #[test]
    fn media_parts_are_decoded_in_order() {
        let req = parse(
            r#"{"model":"m","messages":[{"role":"user","content":[
                {"type":"text","text":"look"},
                {"type":"image_url","image_url":{"url":"data:image/png;base64,AAEC"}},
                {"type":"input_audio","input_audio":{"data":"AwQ=","format":"wav"}}]}]}"#,
        )
        .unwrap();
        let parts = &req.messages[0].parts;
        assert_eq!(parts[0], Part::Text("look".into()));
        assert_eq!(parts[1], Part::Image(vec![0u8, 1, 2].into()));
        assert_eq!(
            parts[2],
            Part::Audio {
                data: vec![3u8, 4].into(),
                format: "wav".into()
            }
        );
        assert_eq!(req.modality(), switchyard_plugin_api::Modality::ImageAudio);
    }

    #[test]
    fn remote_urls_and_bad_base64_name_the_part() {
        let err = parse(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].content[0]"));
        let err = parse(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_audio","input_audio":{"data":"%%%","format":"wav"}}]}]}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].content[1]"));
    }

    #[test]
    fn sampling_fields_map_and_are_checked() {
        let req = parse(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stop":"x","temperature":0}"#).unwrap();
        assert_eq!(req.sampling.max_tokens, ROption::RSome(5));
        assert_eq!(req.stop.len(), 1);
        assert!(parse(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":9}"#
        )
        .is_err());
        assert!(parse(r#"{"model":"m","messages":[{"role":"tool","content":"hi"}]}"#).is_err());
    }

    #[test]
    fn logprobs_and_top_logprobs_are_checked_like_openai() {
        let base = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]"#;
        let with = |extra: &str| parse(&format!("{base},{extra}}}"));
        assert_eq!(
            with(r#""logprobs":true"#).unwrap().logprobs,
            ROption::RSome(0)
        );
        assert_eq!(
            with(r#""logprobs":true,"top_logprobs":20"#)
                .unwrap()
                .logprobs,
            ROption::RSome(20)
        );
        assert_eq!(
            with(r#""logprobs":false"#).unwrap().logprobs,
            ROption::RNone
        );
        assert_eq!(
            parse(&format!("{base}}}")).unwrap().logprobs,
            ROption::RNone
        );
        let err = with(r#""logprobs":true,"top_logprobs":21"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("top_logprobs"));
        let err = with(r#""top_logprobs":3"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("top_logprobs"));
    }

    #[test]
    fn model_options_pass_verbatim_and_must_be_an_object() {
        let base = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]"#;
        let req = parse(&format!(
            r#"{base},"model_options":{{"adapter":"speech","n":[1,2]}}}}"#
        ))
        .unwrap();
        let options = req.model_options_json().unwrap().unwrap();
        assert_eq!(options["adapter"], "speech");
        assert_eq!(options["n"], serde_json::json!([1, 2]));
        assert_eq!(
            parse(&format!("{base}}}")).unwrap().model_options_json(),
            Ok(None)
        );
        let err = parse(&format!(r#"{base},"model_options":"speech"}}"#)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model_options"));
    }

    fn completion(json: &str) -> Result<Submission, ApiError> {
        serde_json::from_str::<CompletionRequest>(json)
            .unwrap()
            .to_plugin(9)
    }

    #[test]
    fn completion_prompts_are_one_string_or_one_id_list() {
        let text = completion(r#"{"model":"m","prompt":"hi","max_tokens":3,"stop":"x"}"#).unwrap();
        assert_eq!(text.prompt, Some(Prompt::Text("hi".into())));
        assert!(text.request.messages.is_empty());
        assert_eq!(text.request.sampling.max_tokens, ROption::RSome(3));
        assert_eq!(text.request.stop.len(), 1);
        assert_eq!(text.endpoint_name(), "completions");
        let ids = completion(r#"{"model":"m","prompt":[1,2,3],"logprobs":2}"#).unwrap();
        assert_eq!(ids.prompt, Some(Prompt::Tokens(vec![1u32, 2, 3])));
        assert_eq!(ids.request.logprobs, ROption::RSome(2));
        for (body, param) in [
            (r#"{"model":"m","prompt":["a","b"]}"#, "prompt"),
            (r#"{"model":"m","prompt":[[1],[2]]}"#, "prompt"),
            (r#"{"model":"m","prompt":[]}"#, "prompt"),
            (r#"{"model":"m","prompt":"a","echo":true}"#, "echo"),
            (r#"{"model":"m","prompt":"a","logprobs":21}"#, "logprobs"),
            (r#"{"model":"m","prompt":"a","n":2}"#, "n"),
            (r#"{"model":"m","prompt":"a","top_p":0}"#, "top_p"),
        ] {
            let err = completion(body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}");
        }
    }
}
