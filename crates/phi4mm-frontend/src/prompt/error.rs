//! Errors of the prompt front end.

/// Everything that can go wrong while building a prompt.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("cannot load {path}: {message}")]
    Load { path: String, message: String },
    #[error("tokenizer and config disagree: {0}")]
    Config(String),
    #[error("message {message} contains the reserved token {token:?}; special tokens cannot be typed in content")]
    ReservedToken { message: usize, token: String },
    #[error("the text yields the reserved token {token:?}, which text cannot carry")]
    ReservedInText { token: String },
    #[error("{kind} placeholders and {kind}s do not match: {placeholders} placeholder(s), {media} {kind}(s)")]
    CountMismatch {
        kind: &'static str,
        placeholders: usize,
        media: usize,
    },
    #[error("message {message} ({role}) carries media; images and audio are only accepted in user turns")]
    MediaOutsideUser { message: usize, role: &'static str },
    #[error("message {message} ({role}) holds the media placeholder {written:?}; placeholders are only bound in user turns")]
    PlaceholderOutsideUser {
        message: usize,
        role: &'static str,
        written: String,
    },
    #[error("tokenizer failed: {0}")]
    Tokenize(String),
}
