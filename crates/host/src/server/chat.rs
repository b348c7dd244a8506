//! `POST /v1/chat/completions`, non-streaming and SSE streaming in OpenAI's chunk format.

use super::{
    dispatch::{dispatch, Dispatched},
    error::ApiError,
    logprobs::{self, LogprobsFormat},
    openai::ChatRequest,
    record::{record_refusal, RequestRecord},
    served_by_headers,
};
use crate::runtime::Runtime;
use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, State},
    http::HeaderMap,
    response::{
        sse::{Event as SseEvent, Sse},
        IntoResponse, Response,
    },
    Json,
};
use serde_json::{json, Value};
use std::{
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};
use switchyard_plugin_api::{
    abi_stable::std_types::ROption, Event, FinishReason, TokenLogprobs, Usage,
};

pub async fn chat_completions(
    State(runtime): State<Arc<Runtime>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let request: ChatRequest = match parse_body(body) {
        Ok(r) => r,
        Err(e) => {
            record_refusal(&runtime, "", "chat", e.status.as_u16(), e.code);
            return e.into_response();
        }
    };
    let id = runtime.next_request_id();
    let dispatched = request
        .to_plugin(id)
        .and_then(|plugin_request| dispatch(&runtime, &request.model, &headers, plugin_request));
    let dispatched = match dispatched {
        Ok(d) => d,
        Err(e) => {
            record_refusal(&runtime, &request.model, "chat", e.status.as_u16(), e.code);
            return e.into_response();
        }
    };
    let record = RequestRecord::new(
        runtime.clone(),
        dispatched.instance().clone(),
        &request.model,
        "chat",
        started,
    );
    let meta = ChunkMeta {
        id: format!("chatcmpl-{id}"),
        created: unix_now(),
        model: request.model.clone(),
    };
    let served_by = served_by_headers(dispatched.instance());
    let logprobs = request.logprobs_format();
    if request.stream {
        let body = stream_chat(
            dispatched,
            record,
            meta,
            StreamOptions {
                include_usage: request.include_usage(),
                logprobs,
            },
            runtime.current().config.server.retry_after_secs,
        );
        (served_by, body).into_response()
    } else {
        match collect(
            dispatched,
            record,
            runtime.current().config.server.retry_after_secs,
            logprobs,
        )
        .await
        {
            Ok(done) => (served_by, Json(meta.completion(&done))).into_response(),
            Err(e) => (served_by, e).into_response(),
        }
    }
}

pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| {
        ApiError::new(
            rejection.status(),
            "invalid_request_error",
            "invalid_body",
            rejection.body_text(),
        )
    })?;
    serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}

pub struct ChunkMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

pub struct Completed {
    pub text: String,
    pub reason: FinishReason,
    pub usage: Usage,
    /// One `logprobs.content` entry per token, when the request asked for them.
    pub logprobs: Option<Vec<Value>>,
}

/// What a streamed chat sends besides the text.
struct StreamOptions {
    include_usage: bool,
    logprobs: Option<LogprobsFormat>,
}

/// A token's `logprobs.content` entry when the request asked for log probabilities. A plugin
/// that accepted such a request must send them with every token; one that does not is broken, and
/// the request fails rather than answering with a silently shorter list.
fn token_logprobs(
    format: Option<LogprobsFormat>,
    sent: &ROption<TokenLogprobs>,
) -> Result<Option<Value>, ApiError> {
    match (format, sent) {
        (None, _) => Ok(None),
        (Some(f), ROption::RSome(l)) => Ok(Some(f.entry(l))),
        (Some(_), ROption::RNone) => Err(ApiError::internal(
            "the model sent a token without the log probabilities the request asked for",
        )),
    }
}

impl ChunkMeta {
    fn completion(&self, done: &Completed) -> Value {
        json!({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": done.text},
                         "logprobs": done.logprobs.clone().map(logprobs::content),
                         "finish_reason": done.reason.as_openai()}],
            "usage": usage_json(done.usage),
        })
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

/// Waits for the whole answer; with `logprobs`, collects every token's entry.
pub async fn collect(
    mut d: Dispatched,
    mut record: RequestRecord,
    retry_after: u32,
    logprobs: Option<LogprobsFormat>,
) -> Result<Completed, ApiError> {
    let mut text = String::new();
    let mut entries = logprobs.map(|_| Vec::new());
    while let Some(event) = d.events.recv().await {
        match event {
            Event::Started { .. } => {}
            Event::Token {
                text: piece,
                logprobs: sent,
                ..
            } => {
                record.token();
                text.push_str(&piece);
                match token_logprobs(logprobs, &sent) {
                    Ok(Some(entry)) => entries.get_or_insert_with(Vec::new).push(entry),
                    Ok(None) => {}
                    Err(e) => {
                        // Dropping `d` unfinished cancels the request in the plugin.
                        record.fail(e.status.as_u16(), e.code);
                        return Err(e);
                    }
                }
            }
            Event::Finished { reason, usage } => {
                d.admission.mark_finished();
                record.finish(200);
                return Ok(Completed {
                    text,
                    reason,
                    usage,
                    logprobs: entries,
                });
            }
            Event::Failed(error) => {
                d.admission.mark_finished();
                let e = ApiError::from_plugin(&error, retry_after);
                record.fail(e.status.as_u16(), e.code);
                return Err(e);
            }
        }
    }
    d.admission.mark_finished();
    record.fail(500, "no_terminal_event");
    Err(ApiError::internal(
        "the model ended the request without finishing it",
    ))
}

fn stream_chat(
    mut d: Dispatched,
    mut record: RequestRecord,
    meta: ChunkMeta,
    options: StreamOptions,
    retry_after: u32,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    let include_usage = options.include_usage;
    let stream = async_stream::stream! {
        let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
        yield data(meta.chunk(json!({"role": "assistant", "content": ""}), None, include_usage));
        loop {
            match d.events.recv().await {
                Some(Event::Started { .. }) => {}
                Some(Event::Token { text, logprobs: sent, .. }) => {
                    record.token();
                    let mut chunk = meta.chunk(json!({"content": text.as_str()}), None, include_usage);
                    match token_logprobs(options.logprobs, &sent) {
                        Ok(Some(entry)) => chunk["choices"][0]["logprobs"] = logprobs::content(vec![entry]),
                        Ok(None) => {}
                        Err(e) => {
                            record.fail(e.status.as_u16(), e.code);
                            yield data(e.body());
                            break;
                        }
                    }
                    yield data(chunk);
                }
                Some(Event::Finished { reason, usage }) => {
                    d.admission.mark_finished();
                    record.finish(200);
                    yield data(meta.chunk(json!({}), Some(reason.as_openai()), include_usage));
                    if include_usage {
                        yield data(meta.usage_chunk(usage));
                    }
                    yield Ok(SseEvent::default().data("[DONE]"));
                    break;
                }
                Some(Event::Failed(error)) => {
                    d.admission.mark_finished();
                    let e = ApiError::from_plugin(&error, retry_after);
                    record.fail(e.status.as_u16(), e.code);
                    // OpenAI sends an error object mid-stream; no [DONE] follows, so a client
                    // can tell a failed stream from a finished one.
                    yield data(e.body());
                    break;
                }
                None => {
                    d.admission.mark_finished();
                    record.fail(500, "no_terminal_event");
                    yield data(ApiError::internal("the model ended the request without finishing it").body());
                    break;
                }
            }
        }
    };
    Sse::new(stream)
}
