//! `POST /v1/chat/completions`, non-streaming and SSE streaming in OpenAI's chunk format.

use super::{
    error::ApiError,
    event_stream::Answer,
    generation::{admit, stream_answer, Admitted, ChunkFormat, ChunkMeta, JsonRequest},
    logprobs::{self, LogprobsFormat},
    openai::ChatRequest,
    outcome::{Refused, Served},
};
use crate::{instance::Submission, runtime::Runtime};
use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, State},
    http::HeaderMap,
    Json,
};
use serde_json::{json, Value};
use std::{
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};
use switchyard_plugin_api::{FinishReason, Request, TokenLogprobs, Usage};

pub async fn chat_completions(
    State(runtime): State<Arc<Runtime>>,
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
        id: format!("chatcmpl-{id}"),
        created: unix_now(),
        model: request.model.clone(),
    };
    let logprobs = request.logprobs_format();
    let retry_after = runtime.current().config.server().retry_after_secs;
    if request.generation.stream {
        let include_usage = request.generation.include_usage();
        let body = stream_answer(
            events,
            meta,
            ChatChunks { logprobs },
            include_usage,
            retry_after,
        );
        return Ok(Served::new(instance, body));
    }
    Ok(match events.answer().await {
        Ok(answer) => Served::new(instance, Json(completion(&meta, &answer, logprobs))),
        Err(failure) => Served::new(instance, failure.to_api_error(retry_after)),
    })
}

impl JsonRequest for ChatRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn to_submission(&self, id: u64) -> Result<Submission, ApiError> {
        self.to_plugin(id).map(Submission::from)
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
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}

/// What the chat endpoint does with a body before routing it: the JSON parse and the
/// conversion to the plugin request (media decoded). Public for the fuzz targets.
pub fn chat_request_from_json(body: &[u8], id: u64) -> Result<Request, ApiError> {
    parse_json::<ChatRequest>(body)?.to_plugin(id)
}

/// The `chat.completion` body of a finished answer.
fn completion(meta: &ChunkMeta, answer: &Answer, format: Option<LogprobsFormat>) -> Value {
    let logprobs =
        format.map(|f| logprobs::content(answer.logprobs.iter().map(|l| f.entry(l)).collect()));
    let choice = json!({"index": 0, "message": {"role": "assistant", "content": answer.text},
                        "logprobs": logprobs, "finish_reason": answer.reason.as_openai()});
    let mut body = meta.object("chat.completion", vec![choice]);
    body["usage"] = usage_json(answer.usage);
    body
}

/// `chat.completion.chunk`s: the role first, then content deltas.
struct ChatChunks {
    logprobs: Option<LogprobsFormat>,
}

impl ChunkFormat for ChatChunks {
    const OBJECT: &'static str = "chat.completion.chunk";

    fn opening(&self) -> Option<Value> {
        Some(
            json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                    "finish_reason": null}),
        )
    }

    fn token(&mut self, text: &str, logprobs: Option<&TokenLogprobs>) -> Value {
        let mut choice = json!({"index": 0, "delta": {"content": text}, "finish_reason": null});
        if let (Some(format), Some(sent)) = (self.logprobs, logprobs) {
            choice["logprobs"] = logprobs::content(vec![format.entry(sent)]);
        }
        choice
    }

    fn finish(&self, reason: FinishReason) -> Value {
        json!({"index": 0, "delta": {}, "finish_reason": reason.as_openai()})
    }
}

pub fn usage_json(usage: Usage) -> Value {
    json!({"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
           "total_tokens": usage.prompt_tokens + usage.completion_tokens})
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
