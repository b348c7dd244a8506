//! `POST /v1/audio/transcriptions` (multipart, as OpenAI's): a transcription is a request with one
//! audio clip (plus the optional `prompt` text) on the transcription endpoint; the plugin knows
//! the instruction its model needs.

use super::{
    chat::{collect, usage_json},
    dispatch::dispatch,
    error::ApiError,
    record::{record_refusal, RequestRecord},
    served_by_headers,
};
use crate::runtime::Runtime;
use abi_stable::std_types::RVec;
use axum::{
    extract::{multipart::MultipartRejection, Multipart, State},
    http::HeaderMap,
    response::{
        sse::{Event as SseEvent, Sse},
        IntoResponse, Response,
    },
    Json,
};
use serde_json::json;
use std::{sync::Arc, time::Instant};
use switchyard_plugin_api::{Endpoint, Event, Message, Part, Request, Role, SamplingParams};

#[derive(Default)]
struct Form {
    file: Option<(Vec<u8>, String)>,
    model: Option<String>,
    prompt: Option<String>,
    response_format: Option<String>,
    temperature: Option<f32>,
    stream: bool,
}

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
    while let Some(field) = multipart.next_field().await.map_err(field_error)? {
        let name = field.name().unwrap_or_default().to_string();
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
                form.temperature = Some(
                    text.trim()
                        .parse()
                        .map_err(|_| ApiError::invalid_param("temperature", "not a number"))?,
                );
            }
            "stream" => form.stream = field.text().await.map_err(field_error)?.trim() == "true",
            // language, timestamp_granularities[], include[] ...: accepted and ignored.
            _ => {
                let _ = field.bytes().await.map_err(field_error)?;
            }
        }
    }
    Ok(form)
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

pub async fn transcriptions(
    State(runtime): State<Arc<Runtime>>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Response {
    let started = Instant::now();
    let form = match read_form(multipart).await {
        Ok(f) => f,
        Err(e) => {
            record_refusal(&runtime, "", "transcription", e.status.as_u16(), e.code);
            return e.into_response();
        }
    };
    let checked = (|| {
        let model = form
            .model
            .clone()
            .ok_or_else(|| ApiError::invalid_param("model", "the model field is required"))?;
        let (data, format) = form
            .file
            .clone()
            .ok_or_else(|| ApiError::invalid_param("file", "the file field is required"))?;
        let format_out = form
            .response_format
            .clone()
            .unwrap_or_else(|| "json".into());
        if !matches!(format_out.as_str(), "json" | "text") {
            return Err(ApiError::invalid_param(
                "response_format",
                "supported: json, text",
            ));
        }
        Ok((model, data, format, format_out))
    })();
    let (model, data, format, response_format) = match checked {
        Ok(v) => v,
        Err(e) => {
            record_refusal(&runtime, "", "transcription", e.status.as_u16(), e.code);
            return e.into_response();
        }
    };
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
    let d = match dispatch(&runtime, &model, &headers, request) {
        Ok(d) => d,
        Err(e) => {
            record_refusal(&runtime, &model, "transcription", e.status.as_u16(), e.code);
            return e.into_response();
        }
    };
    let mut record = RequestRecord::new(
        runtime.clone(),
        d.instance().clone(),
        &model,
        "transcription",
        started,
    );
    let served_by = served_by_headers(d.instance());
    let retry_after = runtime.current().config.server.retry_after_secs;
    if form.stream {
        let mut d = d;
        let stream = async_stream::stream! {
            let mut text = String::new();
            loop {
                match d.events.recv().await {
                    Some(Event::Started { .. }) => {}
                    Some(Event::Token { text: piece, .. }) => {
                        record.token();
                        text.push_str(&piece);
                        yield Ok::<_, std::convert::Infallible>(SseEvent::default().data(
                            json!({"type": "transcript.text.delta", "delta": piece.as_str()}).to_string()));
                    }
                    Some(Event::Finished { usage, .. }) => {
                        d.admission.mark_finished();
                        record.finish(200);
                        yield Ok(SseEvent::default().data(json!({"type": "transcript.text.done", "text": text,
                            "usage": usage_json(usage)}).to_string()));
                        break;
                    }
                    Some(Event::Failed(error)) => {
                        d.admission.mark_finished();
                        let e = ApiError::from_plugin(&error, retry_after);
                        record.fail(e.status.as_u16(), e.code);
                        yield Ok(SseEvent::default().data(e.body().to_string()));
                        break;
                    }
                    None => {
                        d.admission.mark_finished();
                        record.fail(500, "no_terminal_event");
                        yield Ok(SseEvent::default().data(ApiError::internal("the model ended the request without finishing it").body().to_string()));
                        break;
                    }
                }
            }
        };
        return (served_by, Sse::new(stream)).into_response();
    }
    match collect(d, record, retry_after, None).await {
        Ok(done) if response_format == "text" => (served_by, done.text).into_response(),
        Ok(done) => (
            served_by,
            Json(json!({"text": done.text, "usage": {"type": "tokens",
            "input_tokens": done.usage.prompt_tokens, "output_tokens": done.usage.completion_tokens,
            "total_tokens": done.usage.prompt_tokens + done.usage.completion_tokens}})),
        )
            .into_response(),
        Err(e) => (served_by, e).into_response(),
    }
}
