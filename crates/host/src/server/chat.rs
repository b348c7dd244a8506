//! `POST /v1/chat/completions`, non-streaming and SSE streaming in OpenAI's chunk format.

use super::{
    admin::is_json,
    dispatch::dispatch,
    error::ApiError,
    event_stream::{Answer, EventStream, Step},
    logprobs::{self, LogprobsFormat},
    openai::ChatRequest,
    outcome::{Refused, Served},
};
use crate::runtime::Runtime;
use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, State},
    http::HeaderMap,
    response::sse::{Event as SseEvent, Sse},
    Json,
};
use futures_util::{stream, Stream, StreamExt};
use serde_json::{json, Value};
use std::{
    convert::Infallible,
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};
use switchyard_plugin_api::{Request, Usage};

pub async fn chat_completions(
    State(runtime): State<Arc<Runtime>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Served, Refused> {
    let started = Instant::now();
    // Only JSON: a browser's cross-site form or text/plain POST cannot reach a model.
    if !is_json(&headers) {
        return Err(Refused::unread(ApiError::unsupported_media_type(
            "application/json",
        )));
    }
    let body = read_bytes(body).map_err(Refused::unread)?;
    let id = runtime.next_request_id();
    // Parsing a large body, decoding its media and the plugin's admission (which may tokenize
    // the prompt and read media headers) are CPU work: they run on the blocking pool, a few at
    // a time, so that they never stall the async threads that serve `/health` and the streams.
    let rt = runtime.clone();
    let (request, events) = runtime
        .off_the_runtime(move || {
            let request: ChatRequest = parse_json(&body)?;
            let events = request.to_plugin(id).and_then(|plugin_request| {
                dispatch(&rt, &request.model, &headers, plugin_request, started)
            });
            Ok((request, events))
        })
        .await
        .map_err(Refused::unread)?;
    let events = events.map_err(|e| Refused::new(runtime.model_label(&request.model), e))?;
    let instance = events.instance().clone();
    let meta = ChunkMeta {
        id: format!("chatcmpl-{id}"),
        created: unix_now(),
        model: request.model.clone(),
    };
    let logprobs = request.logprobs_format();
    let retry_after = runtime.current().config.server().retry_after_secs;
    if request.stream {
        let options = StreamOptions {
            include_usage: request.include_usage(),
            logprobs,
        };
        let body = stream_chat(events, meta, options, retry_after);
        return Ok(Served::new(instance, body));
    }
    Ok(match events.answer().await {
        Ok(answer) => Served::new(instance, Json(meta.completion(&answer, logprobs))),
        Err(failure) => Served::new(instance, failure.to_api_error(retry_after)),
    })
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

pub struct ChunkMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// What a streamed chat sends besides the text.
struct StreamOptions {
    include_usage: bool,
    logprobs: Option<LogprobsFormat>,
}

impl ChunkMeta {
    fn completion(&self, answer: &Answer, format: Option<LogprobsFormat>) -> Value {
        let logprobs =
            format.map(|f| logprobs::content(answer.logprobs.iter().map(|l| f.entry(l)).collect()));
        json!({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                         "logprobs": logprobs,
                         "finish_reason": answer.reason.as_openai()}],
            "usage": usage_json(answer.usage),
        })
    }

    /// The SSE data one step of the answer sends.
    fn stream_data(&self, step: Step, options: &StreamOptions, retry_after: u32) -> Vec<String> {
        let include_usage = options.include_usage;
        match step {
            Step::Token { text, logprobs } => {
                let mut chunk = self.chunk(json!({"content": text.as_str()}), None, include_usage);
                if let (Some(format), Some(sent)) = (options.logprobs, logprobs) {
                    chunk["choices"][0]["logprobs"] = logprobs::content(vec![format.entry(&sent)]);
                }
                vec![chunk.to_string()]
            }
            Step::Finished { reason, usage } => {
                let mut data = vec![self
                    .chunk(json!({}), Some(reason.as_openai()), include_usage)
                    .to_string()];
                if include_usage {
                    data.push(self.usage_chunk(usage).to_string());
                }
                data.push("[DONE]".into());
                data
            }
            // OpenAI sends an error object mid-stream; no [DONE] follows, so a client can tell
            // a failed stream from a finished one.
            Step::Failed(failure) => vec![failure.to_api_error(retry_after).body().to_string()],
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, include_usage: bool) -> Value {
        let mut chunk = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn usage_chunk(&self, usage: Usage) -> Value {
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [], "usage": usage_json(usage),
        })
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

fn stream_chat(
    events: EventStream,
    meta: ChunkMeta,
    options: StreamOptions,
    retry_after: u32,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let role = meta.chunk(
        json!({"role": "assistant", "content": ""}),
        None,
        options.include_usage,
    );
    let rest = events
        .into_steps()
        .flat_map(move |step| stream::iter(meta.stream_data(step, &options, retry_after)));
    let data = stream::once(async move { role.to_string() }).chain(rest);
    Sse::new(data.map(|d| Ok(SseEvent::default().data(d))))
}
