//! `POST /v1/completions`: OpenAI's legacy completions, one raw prompt (text or token ids),
//! answered as one `text_completion` body or as SSE chunks of the same object. Routed like a
//! text chat; the plugin reads the prompt through `submit_prompt` (plugin API 2.1).

use super::{
    chat::unix_now,
    error::ApiError,
    generation::{
        admit, stream_once_started, Admitted, ChunkFormat, ChunkMeta, JsonRequest, UsageField,
    },
    logprobs::LogprobsFormat,
    openai::CompletionRequest,
    outcome::{self, Refused, Served},
};
use crate::instance::COMPLETIONS;
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
use std::{sync::Arc, time::Instant};
use switchyard_plugin_api::{FinishReason, TokenLogprobs};

const OBJECT: &str = "text_completion";

/// The handler of its route: [`complete`], with its refusals counted.
pub async fn completions(
    State(runtime): State<Arc<Runtime>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let metrics = runtime.metrics.clone();
    outcome::respond(
        &metrics,
        COMPLETIONS,
        complete(runtime, headers, body).await,
    )
}

async fn complete(
    runtime: Arc<Runtime>,
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
        id: runtime.response_id("cmpl", id),
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
        let chunks = CompletionChunks {
            logprobs,
            offset: 0,
        };
        let body = stream_once_started(events, meta, chunks, include_usage, retry_after).await;
        return Ok(Served::new(instance, body));
    }
    Ok(match events.answer().await {
        Ok(answer) => {
            let logprobs = logprobs
                .map(|f| f.legacy(answer.text_offsets.iter().copied().zip(&answer.logprobs)));
            let choice = Choice {
                index: 0,
                text: &answer.text,
                logprobs,
                finish_reason: Some(answer.reason.as_openai()),
            };
            let usage = UsageField::Counts(answer.usage);
            Served::new(
                instance,
                Json(meta.envelope(OBJECT, std::slice::from_ref(&choice), usage)),
            )
        }
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

/// The one choice of a `text_completion` answer or chunk.
#[derive(Serialize)]
struct Choice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<Value>,
    finish_reason: Option<&'static str>,
}

/// `text_completion` chunks: one per token, each with its token's `logprobs` when asked.
struct CompletionChunks {
    logprobs: Option<LogprobsFormat>,
    /// Characters of the tokens so far: the next token's `text_offset` (not the text sent so
    /// far, which lags behind it while the plugin holds back a possible stop string).
    offset: usize,
}

impl ChunkFormat for CompletionChunks {
    const OBJECT: &'static str = OBJECT;
    type Choice<'a> = Choice<'a>;

    fn opening(&self) -> Option<Choice<'static>> {
        None
    }

    fn token<'a>(&mut self, text: &'a str, logprobs: Option<&TokenLogprobs>) -> Choice<'a> {
        let logprobs = match (self.logprobs, logprobs) {
            (Some(format), Some(token)) => {
                let offset = self.offset;
                self.offset += super::logprobs::chars_begun(&token.sampled.bytes);
                Some(format.legacy([(offset, token)]))
            }
            _ => None,
        };
        Choice {
            index: 0,
            text,
            logprobs,
            finish_reason: None,
        }
    }

    fn finish(&self, reason: FinishReason) -> Choice<'static> {
        Choice {
            index: 0,
            text: "",
            logprobs: None,
            finish_reason: Some(reason.as_openai()),
        }
    }
}
