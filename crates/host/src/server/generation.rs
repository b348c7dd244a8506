//! What the two JSON generation endpoints, `/v1/chat/completions` and `/v1/completions`,
//! share: from a body to an admitted request ([`admit`]), and the order of a streamed answer
//! ([`stream_answer`]). Each endpoint only says how its JSON looks ([`JsonRequest`],
//! [`ChunkFormat`]).

use super::{
    admin::is_json,
    chat::{parse_json, read_bytes},
    dispatch::{dispatch, Rejection},
    error::ApiError,
    event_stream::{EventStream, Step},
    outcome::Refused,
};
use crate::{instance::Submission, runtime::Runtime};
use axum::{
    body::Bytes,
    extract::rejection::BytesRejection,
    http::HeaderMap,
    response::sse::{Event as SseEvent, Sse},
};
use futures_util::{stream, Stream, StreamExt};
use serde::{Serialize, Serializer};
use std::{convert::Infallible, sync::Arc, time::Instant};
use switchyard_plugin_api::{FinishReason, TokenLogprobs, Usage};

/// A generation endpoint's request body.
pub trait JsonRequest: serde::de::DeserializeOwned + Send + 'static {
    /// The model the client named.
    fn model(&self) -> &str;
    /// The checked plugin request; errors name the offending field.
    fn to_submission(&self, id: u64) -> Result<Submission, ApiError>;
}

/// A request an instance took.
pub struct Admitted<T> {
    pub request: T,
    pub events: EventStream,
    /// The host's request id (in the response's `id`).
    pub id: u64,
}

/// Reads, parses, checks and routes a JSON body. Only JSON is taken: a browser's cross-site
/// form or text/plain POST cannot reach a model.
pub async fn admit<T: JsonRequest>(
    runtime: &Arc<Runtime>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    started: Instant,
) -> Result<Admitted<T>, Refused> {
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
    // A small body is admitted here: the pool's two thread switches would cost more.
    let rt = runtime.clone();
    let (request, events) = runtime
        .parse_body(body.len(), move || {
            let request: T = parse_json(&body)?;
            let events =
                request
                    .to_submission(id)
                    .map_err(Rejection::from)
                    .and_then(|submission| {
                        dispatch(&rt, request.model(), &headers, submission, started)
                    });
            Ok((request, events))
        })
        .await
        .map_err(Refused::unread)?;
    let events = events.map_err(|r| Refused::rejected(runtime.model_label(request.model()), r))?;
    Ok(Admitted {
        request,
        events,
        id,
    })
}

/// The fields every chunk and answer of one request carries.
pub struct ChunkMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ChunkMeta {
    /// `{id, object, created, model, choices}`, with `usage` as `usage` says.
    pub fn envelope<'a, C: Serialize>(
        &'a self,
        object: &'static str,
        choices: &'a [C],
        usage: UsageField,
    ) -> Envelope<'a, C> {
        Envelope {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices,
            usage,
        }
    }
}

/// Every answer and chunk of the generation endpoints, serialised straight from borrowed
/// fields. (A `serde_json::Value` tree allocated every key and value, and then freed them: a
/// quarter of a short request's instructions went there.)
#[derive(Serialize)]
pub struct Envelope<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [C],
    #[serde(skip_serializing_if = "UsageField::is_absent")]
    usage: UsageField,
}

/// The `usage` of an answer or chunk: absent, `null` (the chunks before the usage chunk when
/// the client asked for one, as OpenAI sends them), or the counts.
#[derive(Clone, Copy)]
pub enum UsageField {
    Absent,
    Null,
    Counts(Usage),
}

impl UsageField {
    fn is_absent(&self) -> bool {
        matches!(self, Self::Absent)
    }
}

impl Serialize for UsageField {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Absent | Self::Null => serializer.serialize_none(),
            Self::Counts(usage) => UsageCounts::from(*usage).serialize(serializer),
        }
    }
}

/// OpenAI's `usage` object.
#[derive(Serialize)]
pub struct UsageCounts {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
}

impl From<Usage> for UsageCounts {
    fn from(usage: Usage) -> Self {
        Self {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
        }
    }
}

/// JSON text of a value whose serialisation cannot fail (no maps with non-string keys).
pub fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("the answers' types serialise infallibly")
}

/// How one endpoint writes the chunks of a streamed answer.
pub trait ChunkFormat: Send + 'static {
    /// The chunks' `object`.
    const OBJECT: &'static str;
    /// One chunk's choice; it may borrow the token's text.
    type Choice<'a>: Serialize;
    /// The choice of a chunk sent before any token (chat: the role), if any.
    fn opening(&self) -> Option<Self::Choice<'static>>;
    /// The choice of one token's chunk; `logprobs` is set when the request asked for them.
    fn token<'a>(&mut self, text: &'a str, logprobs: Option<&TokenLogprobs>) -> Self::Choice<'a>;
    /// The choice of the last chunk, with its `finish_reason`.
    fn finish(&self, reason: FinishReason) -> Self::Choice<'static>;
}

/// A streamed answer once the model has started the request ([`EventStream::started`]); a
/// request that fails before that gets the status and body a plain answer would (media that do
/// not decode: a 400), not a 200 and an error event.
pub async fn stream_once_started<F: ChunkFormat>(
    events: EventStream,
    meta: ChunkMeta,
    format: F,
    include_usage: bool,
    retry_after: u32,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match events.started().await {
        Ok(events) => {
            stream_answer(events, meta, format, include_usage, retry_after).into_response()
        }
        Err(failure) => failure.to_api_error(retry_after).into_response(),
    }
}

/// A streamed answer in OpenAI's order: the opening chunk, one chunk per token, the finishing
/// chunk, the usage chunk (with `stream_options.include_usage`, when every other chunk has
/// `"usage": null`) and `[DONE]`; or, when the request fails, an error object and no `[DONE]`,
/// so a client can tell a failed stream from a finished one.
pub fn stream_answer<F: ChunkFormat>(
    events: EventStream,
    meta: ChunkMeta,
    mut format: F,
    include_usage: bool,
    retry_after: u32,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let usage = if include_usage {
        UsageField::Null
    } else {
        UsageField::Absent
    };
    let chunk = move |meta: &ChunkMeta, choice: &F::Choice<'_>| {
        to_json(&meta.envelope(F::OBJECT, std::slice::from_ref(choice), usage))
    };
    let opening = format.opening().map(|choice| chunk(&meta, &choice));
    let rest = events.into_steps().flat_map(move |step| {
        let data = match step {
            // A token whose text the model holds back (part of a character, the start of a
            // possible stop string) adds nothing a client reads, unless it carries the token's
            // log probabilities.
            Step::Token {
                text,
                logprobs: None,
            } if text.is_empty() => Vec::new(),
            Step::Token { text, logprobs } => {
                vec![chunk(&meta, &format.token(&text, logprobs.as_ref()))]
            }
            Step::Finished { reason, usage } => {
                let mut data = vec![chunk(&meta, &format.finish(reason))];
                if include_usage {
                    data.push(usage_chunk::<F>(&meta, usage));
                }
                data.push("[DONE]".into());
                data
            }
            Step::Failed(failure) => vec![failure.to_api_error(retry_after).body().to_string()],
        };
        stream::iter(data)
    });
    let data = stream::iter(opening).chain(rest);
    Sse::new(data.map(|d| Ok(SseEvent::default().data(d))))
}

fn usage_chunk<F: ChunkFormat>(meta: &ChunkMeta, usage: Usage) -> String {
    let none: &[F::Choice<'_>] = &[];
    to_json(&meta.envelope(F::OBJECT, none, UsageField::Counts(usage)))
}
