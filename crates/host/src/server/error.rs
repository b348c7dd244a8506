//! Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.

use crate::instance::Submission;
use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;
use switchyard_plugin_api::{Endpoint, ErrorKind, PluginError};

/// What the parts of a plugin request (`messages[i].parts[j]`) are called in the client's
/// request, for an error that blames one ([`ApiError::from_plugin`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartNames {
    /// A chat: message `i`'s part `j` is its content part `j` (a string content is its one
    /// text part), for each of its `messages`.
    Chat { messages: usize },
    /// A transcription's one message: the form's `file`, then its `prompt`
    /// (`crates/host/src/server/transcriptions.rs` builds it so).
    Transcription,
    /// A completion's prompt comes without messages.
    Nothing,
}

impl PartNames {
    pub fn of(submission: &Submission) -> Self {
        match (&submission.prompt, submission.request.endpoint) {
            (Some(_), _) => Self::Nothing,
            (None, Endpoint::Chat) => Self::Chat {
                messages: submission.request.messages.len(),
            },
            (None, Endpoint::Transcription) => Self::Transcription,
        }
    }

    /// The request field that holds message `message`'s part `part`, if the endpoint has one.
    pub fn name(self, (message, part): (usize, usize)) -> Option<String> {
        match self {
            Self::Chat { messages } if message < messages => {
                Some(format!("messages[{message}].content[{part}]"))
            }
            Self::Transcription if message == 0 => match part {
                0 => Some("file".into()),
                1 => Some("prompt".into()),
                _ => None,
            },
            _ => None,
        }
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub retry_after: Option<u32>,
}

/// The most characters of a client's own text an error message repeats.
const SHOWN_CHARS: usize = 64;

/// A client's text as an error message shows it, quoted: at most 64 characters (`SHOWN_CHARS`)
/// and then how long it was, so that a 5 MB `model` field is not answered with a 5 MB error.
pub fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &text[..end], text.len()),
    }
}

/// The most characters of a parser's message an error repeats: it may quote the client's text
/// (`invalid type: string "…"`) whole.
const PARSER_MESSAGE_CHARS: usize = 256;

/// A JSON parser's error as a message: at most 256 characters (`PARSER_MESSAGE_CHARS`) of what it
/// says, then where in the body.
pub fn parser_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    let what = full.strip_suffix(&at).unwrap_or(&full);
    match what.char_indices().nth(PARSER_MESSAGE_CHARS) {
        None => full,
        Some((end, _)) => format!("{}… ({} bytes){at}", &what[..end], what.len()),
    }
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_request",
            message,
        )
    }
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..Self::invalid(message)
        }
    }
    pub fn not_found_model(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            message,
        )
    }
    pub fn overloaded(message: impl Into<String>, retry_after: u32) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "overloaded",
                message,
            )
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "unavailable",
            message,
        )
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            message,
        )
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "admin endpoints need a valid bearer token",
        )
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            code,
            message,
        )
    }
    /// A body of another content type than `expected`.
    pub fn unsupported_media_type(expected: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "unsupported_media_type",
            format!("this endpoint accepts content-type: {expected} only"),
        )
    }

    /// The client's error for a plugin's. One that blames a part of the request
    /// ([`PluginError::blamed_part`]) names, in `param`, the field of the client's request that
    /// the host made that part from (`names`); a part it cannot name is left in the message.
    pub fn from_plugin(error: &PluginError, retry_after: u32, names: PartNames) -> Self {
        let blamed = error
            .blamed_part()
            .and_then(|(place, rest)| Some((names.name(place)?, rest)));
        match blamed {
            Some((param, rest)) => Self {
                param: Some(param),
                ..Self::from_plugin_kind(error.kind, rest.to_owned(), retry_after)
            },
            None => Self::from_plugin_kind(error.kind, error.message.to_string(), retry_after),
        }
    }

    fn from_plugin_kind(kind: ErrorKind, message: String, retry_after: u32) -> Self {
        match kind {
            ErrorKind::InvalidRequest => Self::invalid(message),
            ErrorKind::Unsupported => Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "unsupported",
                message,
            ),
            ErrorKind::Overloaded => Self::overloaded(message, retry_after),
            ErrorKind::Unavailable => Self::unavailable(message),
            ErrorKind::Cancelled => Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "server_error",
                "cancelled",
                message,
            ),
            ErrorKind::Panic => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "plugin_panic",
                message,
            ),
            ErrorKind::Internal | ErrorKind::InvalidSettings => Self::internal(message),
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blamed_part_is_named_as_the_clients_field_or_left_in_the_message() {
        let blame = |m, p| PluginError::invalid_part(m, p, "image 0: not a PNG");
        let chat = PartNames::Chat { messages: 2 };
        let e = ApiError::from_plugin(&blame(1, 3), 1, chat);
        assert_eq!(e.param.as_deref(), Some("messages[1].content[3]"));
        assert_eq!(e.message, "image 0: not a PNG");
        assert_eq!(e.status.as_u16(), 400);
        // A message the request does not have: named nowhere, the place stays in the text.
        let e = ApiError::from_plugin(&blame(2, 0), 1, chat);
        assert_eq!(e.param, None);
        assert_eq!(e.message, "messages[2].parts[0]: image 0: not a PNG");
        let names = |m, p| {
            ApiError::from_plugin(&blame(m, p), 1, PartNames::Transcription)
                .param
                .unwrap_or_default()
        };
        assert_eq!(
            [names(0, 0), names(0, 1), names(0, 2), names(1, 0)],
            ["file", "prompt", "", ""]
        );
        let e = ApiError::from_plugin(&blame(0, 0), 1, PartNames::Nothing);
        assert_eq!(e.param, None);
    }
}
