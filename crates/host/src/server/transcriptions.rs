//! `POST /v1/audio/transcriptions` (multipart, as OpenAI's): a transcription is a request with one
//! audio clip (plus the optional `prompt` text) on the transcription endpoint; the plugin knows
//! the instruction its model needs.

use super::{
    dispatch::dispatch,
    error::ApiError,
    event_stream::{EventStream, Step},
    listener::BodyCharge,
    outcome::{self, Refused, Served},
};
use crate::instance::endpoint_name;
use crate::runtime::Runtime;
use abi_stable::std_types::RVec;
use axum::response::Response;
use axum::{
    extract::{multipart::MultipartRejection, Multipart, State},
    http::HeaderMap,
    response::{
        sse::{Event as SseEvent, Sse},
        IntoResponse,
    },
    Extension, Json,
};
use futures_util::{Stream, StreamExt};
use serde_json::json;
use std::{convert::Infallible, sync::Arc, time::Instant};
use switchyard_plugin_api::{Endpoint, Message, Part, Request, Role, SamplingParams};

#[derive(Default)]
struct Form {
    file: Option<(Vec<u8>, String)>,
    model: Option<String>,
    prompt: Option<String>,
    response_format: Option<String>,
    temperature: Option<f32>,
    stream: bool,
}

/// The form fields this endpoint reads; others are accepted and ignored.
const KNOWN_FIELDS: [&str; 6] = [
    "file",
    "model",
    "prompt",
    "response_format",
    "temperature",
    "stream",
];

async fn read_form(multipart: Result<Multipart, MultipartRejection>) -> Result<Form, ApiError> {
    let mut multipart = multipart.map_err(|r| {
        ApiError::new(
            r.status(),
            "invalid_request_error",
            "invalid_body",
            r.body_text(),
        )
    })?;
    let mut form = Form::default();
    let field_error = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(
            e.status(),
            "invalid_request_error",
            "invalid_body",
            e.body_text(),
        )
    };
    let mut seen: Vec<String> = Vec::new();
    while let Some(field) = multipart.next_field().await.map_err(field_error)? {
        let name = field.name().unwrap_or_default().to_string();
        // A field given twice would silently lose one of its values (one clip of two).
        if KNOWN_FIELDS.contains(&name.as_str()) {
            if seen.contains(&name) {
                return Err(ApiError::invalid_param(
                    name.clone(),
                    format!("the form has more than one {name} field"),
                ));
            }
            seen.push(name.clone());
        }
        match name.as_str() {
            "file" => {
                let format = audio_format(field.file_name(), field.content_type());
                let bytes = field.bytes().await.map_err(field_error)?;
                form.file = Some((bytes.to_vec(), format));
            }
            "model" => form.model = Some(field.text().await.map_err(field_error)?),
            "prompt" => form.prompt = Some(field.text().await.map_err(field_error)?),
            "response_format" => {
                form.response_format = Some(field.text().await.map_err(field_error)?)
            }
            "temperature" => {
                let text = field.text().await.map_err(field_error)?;
                let temperature: f32 = text
                    .trim()
                    .parse()
                    .map_err(|_| ApiError::invalid_param("temperature", "not a number"))?;
                // OpenAI's range for transcriptions (chat's is 0–2).
                if !(0.0..=1.0).contains(&temperature) {
                    return Err(ApiError::invalid_param(
                        "temperature",
                        "must be between 0 and 1",
                    ));
                }
                form.temperature = Some(temperature);
            }
            "stream" => {
                // As a form's booleans are written (curl -F stream=true, the SDKs' "true").
                form.stream = match field.text().await.map_err(field_error)?.trim() {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(ApiError::invalid_param(
                            "stream",
                            format!("must be true or false, not {}", super::error::shown(other)),
                        ))
                    }
                }
            }
            // language, timestamp_granularities[], include[] ...: accepted and ignored.
            _ => {
                let _ = field.bytes().await.map_err(field_error)?;
            }
        }
    }
    Ok(form)
}

/// What the form holds besides the model, the clip and the response format.
struct FormRest {
    prompt: Option<String>,
    temperature: Option<f32>,
    stream: bool,
}

impl Form {
    /// The model, the clip and its format, the response format and the rest; errors name the
    /// field. The clip is moved, not copied (it may be `max_body_bytes` long).
    fn checked(self) -> Result<(String, Vec<u8>, String, String, FormRest), ApiError> {
        let model = self
            .model
            .ok_or_else(|| ApiError::invalid_param("model", "the model field is required"))?;
        let (data, format) = self
            .file
            .ok_or_else(|| ApiError::invalid_param("file", "the file field is required"))?;
        let response_format = self.response_format.unwrap_or_else(|| "json".into());
        if !matches!(response_format.as_str(), "json" | "text") {
            return Err(ApiError::invalid_param(
                "response_format",
                "supported: json, text",
            ));
        }
        let rest = FormRest {
            prompt: self.prompt,
            temperature: self.temperature,
            stream: self.stream,
        };
        Ok((model, data, format, response_format, rest))
    }
}

/// `wav`, `mp3`, ... from the file name, else from the content type, else empty.
fn audio_format(file_name: Option<&str>, content_type: Option<&str>) -> String {
    if let Some(ext) = file_name
        .and_then(|n| n.rsplit_once('.'))
        .map(|(_, e)| e.to_ascii_lowercase())
    {
        return ext;
    }
    match content_type {
        Some(ct) if ct.starts_with("audio/") => {
            ct["audio/".len()..].trim_start_matches("x-").to_string()
        }
        _ => String::new(),
    }
}

/// The handler of its route: [`transcribe`], with its refusals counted.
pub async fn transcriptions(
    State(runtime): State<Arc<Runtime>>,
    headers: HeaderMap,
    charge: Option<Extension<BodyCharge>>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Response {
    let metrics = runtime.metrics.clone();
    outcome::respond(
        &metrics,
        endpoint_name(Endpoint::Transcription),
        transcribe(runtime, headers, charge, multipart).await,
    )
}

/// `charge` is the body's share of `max_buffered_body_bytes`: the multipart reader copies the
/// body out of the bytes that held it, so it is held here until the clip is admitted.
async fn transcribe(
    runtime: Arc<Runtime>,
    headers: HeaderMap,
    charge: Option<Extension<BodyCharge>>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Served, Refused> {
    let started = Instant::now();
    if !super::admin::content_type_is(&headers, "multipart/form-data") {
        return Err(Refused::unread(ApiError::unsupported_media_type(
            "multipart/form-data",
        )));
    }
    let form = read_form(multipart).await.map_err(Refused::unread)?;
    let (model, data, format, response_format, form) = form.checked().map_err(Refused::unread)?;
    let mut parts = vec![Part::Audio {
        data: RVec::from(data),
        format: format.into(),
    }];
    if let Some(prompt) = form.prompt.filter(|p| !p.is_empty()) {
        parts.push(Part::Text(prompt.into()));
    }
    let request = Request {
        sampling: SamplingParams {
            temperature: form.temperature.unwrap_or(0.0),
            ..SamplingParams::default()
        },
        ..Request::new(
            runtime.next_request_id(),
            Endpoint::Transcription,
            vec![Message {
                role: Role::User,
                parts: parts.into(),
            }],
        )
    };
    // The plugin's admission may probe the clip and tokenize the prompt: on the blocking pool.
    // The body's charge goes with it, as a chat body's does, through the wait for a turn and
    // the admission, for the clip is as large as the body was.
    let (rt, requested) = (runtime.clone(), model.clone());
    let events = runtime
        .off_the_runtime(move || {
            let admitted = dispatch(&rt, &requested, &headers, request, started);
            drop(charge);
            admitted
        })
        .await
        .map_err(|r| Refused::rejected(runtime.model_label(&model), r))?;
    let instance = events.instance().clone();
    let retry_after = runtime.retry_after_secs();
    let response = if form.stream {
        // As chat's: the status waits for the request to start (a clip that does not decode
        // is a 400, streamed or not).
        match events.started().await {
            Ok(events) => stream_transcript(events, retry_after).into_response(),
            Err(failure) => failure.to_api_error(retry_after).into_response(),
        }
    } else {
        match events.answer().await {
            Ok(answer) if response_format == "text" => answer.text.into_response(),
            Ok(answer) => {
                Json(json!({"text": answer.text, "usage": transcription_usage(answer.usage)}))
                    .into_response()
            }
            Err(failure) => failure.to_api_error(retry_after).into_response(),
        }
    };
    Ok(Served::new(instance, response))
}

/// OpenAI's usage object of a transcription, streamed or not (token-billed models): not chat's
/// `prompt_tokens` / `completion_tokens`.
fn transcription_usage(usage: switchyard_plugin_api::Usage) -> serde_json::Value {
    json!({"type": "tokens", "input_tokens": usage.prompt_tokens,
           "output_tokens": usage.completion_tokens,
           "total_tokens": usage.prompt_tokens + usage.completion_tokens})
}

/// `transcript.text.delta` per token, then `transcript.text.done` with the whole text.
fn stream_transcript(
    events: EventStream,
    retry_after: u32,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let mut text = String::new();
    let data = events.into_steps().filter_map(move |step| {
        std::future::ready(match step {
            // A token whose text the model holds back (part of a character) adds no delta.
            Step::Token { text: piece, .. } if piece.is_empty() => None,
            Step::Token { text: piece, .. } => {
                text.push_str(&piece);
                Some(json!({"type": "transcript.text.delta", "delta": piece.as_str()}))
            }
            Step::Finished { usage, .. } => Some(
                json!({"type": "transcript.text.done", "text": text, "usage": transcription_usage(usage)}),
            ),
            Step::Failed(failure) => Some(failure.to_api_error(retry_after).body()),
        })
    });
    Sse::new(data.map(|v| Ok(SseEvent::default().data(v.to_string()))))
}
