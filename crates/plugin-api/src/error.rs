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
