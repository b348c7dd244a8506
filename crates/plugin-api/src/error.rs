use abi_stable::{std_types::RString, StableAbi};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What went wrong, in terms the host can map to a response (HTTP status, retry, fallback).
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is malformed or violates a limit (HTTP 400).
    InvalidRequest,
    /// The model settings are invalid (model creation fails).
    InvalidSettings,
    /// The request asks for something this model does not do (HTTP 400).
    Unsupported,
    /// Admission refused: queue or slots full. Retrying later may succeed (HTTP 429).
    Overloaded,
    /// The instance is draining or shut down (the host tries a fallback, else HTTP 503).
    Unavailable,
    /// The request was cancelled (client gone, explicit cancel, deadline).
    Cancelled,
    /// A failure inside the model (HTTP 500).
    Internal,
    /// The plugin panicked; the panic was caught at the boundary (HTTP 500).
    Panic,
}

/// A typed error that crosses the ABI.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginError {
    pub kind: ErrorKind,
    pub message: RString,
}

impl PluginError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: RString::from(message.into()),
        }
    }
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }
    pub fn invalid_settings(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidSettings, message)
    }
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Overloaded, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Cancelled, message)
    }

    /// An invalid request blamed on one part of it: `parts[part]` of `messages[message]`. The
    /// place travels at the start of the message, `messages[I].parts[J]: `, so that it passes
    /// through anything that carries an error's text; the host reports it as the error's
    /// `param` (for a chat request, `messages[I].content[J]`, the content part the host made
    /// that part from) and the rest as its message ([`PluginError::blamed_part`]).
    pub fn invalid_part(message: usize, part: usize, what: impl fmt::Display) -> Self {
        Self::invalid_request(format!("messages[{message}].parts[{part}]: {what}"))
    }

    /// The part an error blames (`(message, part)`, see [`PluginError::invalid_part`]) and its
    /// message without the place; `None` when it blames none.
    pub fn blamed_part(&self) -> Option<((usize, usize), &str)> {
        let rest = self.message.strip_prefix("messages[")?;
        let (message, rest) = rest.split_once("].parts[")?;
        let (part, rest) = rest.split_once("]: ")?;
        let index = |digits: &str| {
            // Digits only: `usize::from_str` also takes a leading `+`.
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse().ok())
                .flatten()
        };
        Some(((index(message)?, index(part)?), rest))
    }

    /// Turns a caught panic payload into an error, keeping the panic message when it is a string.
    pub fn from_panic(what: &str, payload: Box<dyn std::any::Any + Send>) -> Self {
        let detail = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_string());
        Self::new(
            ErrorKind::Panic,
            format!("plugin panicked in {what}: {detail}"),
        )
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for PluginError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blamed_part_reads_back_from_the_message() {
        let e = PluginError::invalid_part(2, 13, "image 0: not a PNG: its first chunk is not IHDR");
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert_eq!(
            e.blamed_part(),
            Some(((2, 13), "image 0: not a PNG: its first chunk is not IHDR"))
        );
    }

    #[test]
    fn a_message_that_only_looks_like_a_place_blames_nothing() {
        for message in [
            "image 0: malformed",
            "messages[1].content[0]: what the host says",
            "messages[+1].parts[0]: signed",
            "messages[].parts[0]: empty",
            "messages[1].parts[0] no colon",
            "messages[99999999999999999999999].parts[0]: past usize",
        ] {
            let e = PluginError::invalid_request(message);
            assert_eq!(e.blamed_part(), None, "{message}");
        }
    }
}
