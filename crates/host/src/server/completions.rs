//! `POST /v1/completions`: OpenAI's legacy completions, one raw prompt (text or token ids),
//! answered as one `text_completion` body or as SSE chunks of the same object. Routed like a
//! text chat; the plugin reads the prompt through `submit_prompt` (plugin API 2.1).

use super::{
    chat::{unix_now, usage_json},
    error::ApiError,
    event_stream::Answer,
    generation::{admit, stream_answer, Admitted, ChunkFormat, ChunkMeta, JsonRequest},
    logprobs::LogprobsFormat,
    openai::CompletionRequest,
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
use std::{sync::Arc, time::Instant};
use switchyard_plugin_api::{FinishReason, TokenLogprobs};

const OBJECT: &str = "text_completion";

pub async fn completions(
    State(runtime): State<Arc<Runtime>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Served, Refused> {
    let started = Instant::now();
    let Admitted {
        request,
        events,
        id,
    } = admit::<CompletionRequest>(&runtime, headers, body, started).await?;
    let instance = events.instance().clone();
    let meta = ChunkMeta {
        id: format!("cmpl-{id}"),
        created: unix_now(),
        model: request.model.clone(),
    };
    let logprobs = request.logprobs_format();
    let retry_after = runtime.current().config.server().retry_after_secs;
    if request.generation.stream {
        let include_usage = request.generation.include_usage();
        let chunks = CompletionChunks {
            logprobs,
            offset: 0,
        };
        let body = stream_answer(events, meta, chunks, include_usage, retry_after);
        return Ok(Served::new(instance, body));
    }
    Ok(match events.answer().await {
        Ok(answer) => Served::new(instance, Json(completion(&meta, &answer, logprobs))),
        Err(failure) => Served::new(instance, failure.to_api_error(retry_after)),
    })
}

impl JsonRequest for CompletionRequest {
    fn model(&self) -> &str {
        &self.model
    }
    fn to_submission(&self, id: u64) -> Result<Submission, ApiError> {
        self.to_plugin(id)
    }
}

/// The `text_completion` body of a finished answer.
fn completion(meta: &ChunkMeta, answer: &Answer, format: Option<LogprobsFormat>) -> Value {
    let logprobs =
        format.map(|f| f.legacy(answer.text_offsets.iter().copied().zip(&answer.logprobs)));
    let choice = json!({"index": 0, "text": answer.text, "logprobs": logprobs,
                        "finish_reason": answer.reason.as_openai()});
    let mut body = meta.object(OBJECT, vec![choice]);
    body["usage"] = usage_json(answer.usage);
    body
}

/// `text_completion` chunks: one per token, each with its token's `logprobs` when asked.
struct CompletionChunks {
    logprobs: Option<LogprobsFormat>,
    /// Characters of the completion sent so far (the next token's `text_offset`).
    offset: usize,
}

impl ChunkFormat for CompletionChunks {
    const OBJECT: &'static str = OBJECT;

    fn opening(&self) -> Option<Value> {
        None
    }

    fn token(&mut self, text: &str, logprobs: Option<&TokenLogprobs>) -> Value {
        let logprobs = match (self.logprobs, logprobs) {
            (Some(format), Some(sent)) => format.legacy([(self.offset, sent)]),
            _ => Value::Null,
        };
        self.offset += text.chars().count();
        json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": null})
    }

    fn finish(&self, reason: FinishReason) -> Value {
        json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason.as_openai()})
    }
}
