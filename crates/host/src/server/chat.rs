//! `POST /v1/chat/completions`, non-streaming and SSE streaming in OpenAI's chunk format.

use super::{
    error::ApiError,
    event_stream::Answer,
    generation::{
        admit, stream_once_started, Admitted, ChunkFormat, ChunkMeta, JsonRequest, UsageField,
    },
    logprobs::{self, LogprobsFormat},
    openai::ChatRequest,
    outcome::{self, Refused, Served},
};
use crate::instance::endpoint_name;
use crate::{instance::Submission, runtime::Runtime};
use axum::response::Response;
use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, State},
    http::HeaderMap,
    Json,
};
use serde::Serialize;
use serde_json::Value;
use std::{
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};
use switchyard_plugin_api::{Endpoint, FinishReason, Request, TokenLogprobs};

/// The handler of its route: [`chat`], with its refusals counted.
pub async fn chat_completions(
    State(runtime): State<Arc<Runtime>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let metrics = runtime.metrics.clone();
    outcome::respond(
        &metrics,
        endpoint_name(Endpoint::Chat),
        chat(runtime, headers, body).await,
    )
}

async fn chat(
    runtime: Arc<Runtime>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Served, Refused> {
    let started = Instant::now();
    let Admitted {
        request,
        events,
        id,
    } = admit::<ChatRequest>(&runtime, headers, body, started).await?;
    let instance = events.instance().clone();
    let meta = ChunkMeta {
        id: runtime.response_id("chatcmpl", id),
        created: unix_now(),
        model: request.model.clone(),
    };
    let logprobs = request.logprobs_format();
    let retry_after = runtime.retry_after_secs();
    let (stream, include_usage) = (
        request.generation.stream,
        request.generation.include_usage(),
    );
    // The parsed body (its media as base64, up to max_body_bytes) is not kept while the
    // request waits for its turn and runs.
    drop(request);
    if stream {
        let format = ChatChunks { logprobs };
        let body = stream_once_started(events, meta, format, include_usage, retry_after).await;
        return Ok(Served::new(instance, body));
    }
    Ok(match events.answer().await {
        Ok(answer) => {
            let choice = answer_choice(&answer, logprobs);
            let usage = UsageField::Counts(answer.usage);
            let body = meta.envelope("chat.completion", std::slice::from_ref(&choice), usage);
            Served::new(instance, Json(body))
        }
        Err(failure) => Served::new(instance, failure.to_api_error(retry_after)),
    })
}

impl JsonRequest for ChatRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn to_submission(&self, id: u64) -> Result<Submission, ApiError> {
        let submission = Submission::from(self.to_plugin(id)?);
        Ok(match self.max_completion_tokens {
            // It wins over `max_tokens` (`Generation::to_request`), and a refusal names it.
            Some(_) => Submission {
                max_tokens_field: "max_completion_tokens",
                ..submission
            },
            None => submission,
        })
    }
}

pub fn read_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        ApiError::new(
            rejection.status(),
            "invalid_request_error",
            "invalid_body",
            rejection.body_text(),
        )
    })
}

pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    super::json_values::check(body)?;
    serde_json::from_slice(body).map_err(|e| {
        // A value of the wrong shape is named by its field, found by parsing again with the
        // path tracked: only a refused body pays for the tracking. (Fields flattened into the
        // request, the sampling ones, have no path of their own.)
        let param = (e.classify() == serde_json::error::Category::Data)
            .then(|| {
                let mut json = serde_json::Deserializer::from_slice(body);
                serde_path_to_error::deserialize::<_, T>(&mut json).err()
            })
            .flatten()
            .and_then(|tracked| {
                // A missing field is the path's child: `model`, `messages[0].role`.
                let message = tracked.inner().to_string();
                let missing = missing_field(&message);
                let path = tracked.path().to_string();
                match (missing, path.as_str()) {
                    (Some(field), ".") => Some(field.to_string()),
                    (Some(field), path) => Some(format!("{path}.{field}")),
                    (None, ".") => None,
                    (None, _) => Some(path),
                }
            });
        ApiError {
            param,
            ..ApiError::invalid(format!(
                "invalid JSON body: {}",
                super::error::parser_message(&e)
            ))
        }
    })
}

/// The field serde's "missing field `x`" names.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

/// What the chat endpoint does with a body before routing it: the JSON parse and the
/// conversion to the plugin request (media decoded). Public for the fuzz targets.
pub fn chat_request_from_json(body: &[u8], id: u64) -> Result<Request, ApiError> {
    parse_json::<ChatRequest>(body)?.to_plugin(id)
}

/// The one choice of a `chat.completion`.
#[derive(Serialize)]
struct AnswerChoice<'a> {
    index: u32,
    message: AnswerMessage<'a>,
    logprobs: Option<Value>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct AnswerMessage<'a> {
    role: &'static str,
    content: &'a str,
}

fn answer_choice(answer: &Answer, format: Option<LogprobsFormat>) -> AnswerChoice<'_> {
    let logprobs =
        format.map(|f| logprobs::content(answer.logprobs.iter().map(|l| f.entry(l)).collect()));
    AnswerChoice {
        index: 0,
        message: AnswerMessage {
            role: "assistant",
            content: &answer.text,
        },
        logprobs,
        finish_reason: answer.reason.as_openai(),
    }
}

/// `chat.completion.chunk`s: the role first, then content deltas.
struct ChatChunks {
    logprobs: Option<LogprobsFormat>,
}

/// The one choice of a `chat.completion.chunk`.
#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Value>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

impl ChunkFormat for ChatChunks {
    const OBJECT: &'static str = "chat.completion.chunk";
    type Choice<'a> = ChunkChoice<'a>;

    fn opening(&self) -> Option<ChunkChoice<'static>> {
        Some(ChunkChoice {
            index: 0,
            delta: Delta {
                role: Some("assistant"),
                content: Some(""),
            },
            logprobs: None,
            finish_reason: None,
        })
    }

    fn token<'a>(&mut self, text: &'a str, logprobs: Option<&TokenLogprobs>) -> ChunkChoice<'a> {
        let logprobs = match (self.logprobs, logprobs) {
            (Some(format), Some(sent)) => Some(logprobs::content(vec![format.entry(sent)])),
            _ => None,
        };
        ChunkChoice {
            index: 0,
            delta: Delta {
                role: None,
                content: Some(text),
            },
            logprobs,
            finish_reason: None,
        }
    }

    fn finish(&self, reason: FinishReason) -> ChunkChoice<'static> {
        ChunkChoice {
            index: 0,
            delta: Delta {
                role: None,
                content: None,
            },
            logprobs: None,
            finish_reason: Some(reason.as_openai()),
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(body: &str) -> Option<String> {
        parse_json::<ChatRequest>(body.as_bytes())
            .unwrap_err()
            .param
    }

    #[test]
    fn refused_bodies_name_the_field_at_fault() {
        assert_eq!(param_of(r#"{"messages": []}"#).as_deref(), Some("model"));
        assert_eq!(param_of(r#"{"model": "m"}"#).as_deref(), Some("messages"));
        assert_eq!(
            param_of(r#"{"model": "m", "messages": [{"content": "x"}]}"#).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param_of(r#"{"model": "m", "messages": [{"role": "user", "content": 3}]}"#).as_deref(),
            Some("messages[0].content")
        );
        // Not JSON at all: no field is at fault.
        assert_eq!(param_of("{"), None);
    }

    #[test]
    fn refusals_repeat_little_of_the_clients_text() {
        let long = "x".repeat(100_000);
        let body = format!(r#"{{"model": "m", "messages": [], "temperature": "{long}"}}"#);
        let refused = parse_json::<ChatRequest>(body.as_bytes()).unwrap_err();
        assert!(refused.message.len() < 400, "{}", refused.message.len());
        assert!(
            refused.message.contains("invalid type: string"),
            "{}",
            refused.message
        );
        // Where in the body is kept.
        let at = refused.message.rsplit(" at line 1 column ").next().unwrap();
        assert!(
            at.parse::<usize>().is_ok_and(|c| c > long.len()),
            "{}",
            refused.message
        );
    }
}
