//! Typed checkpoint errors. Every variant names the file, key or tensor at fault so that an
//! operator can fix the checkpoint without reading code. Each message is complete on its own: a
//! wrapped error's text is part of it, and the wrapped error is not also a `source`, so a printer
//! that walks sources (`{:#}` in the tool) does not print it twice.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: invalid JSON: {cause}")]
    Json {
        path: PathBuf,
        cause: serde_json::Error,
    },
    #[error("config key `{key}`: {reason}")]
    InvalidConfig { key: String, reason: String },
    #[error("{path}: safetensors header: {reason}")]
    BadHeader { path: PathBuf, reason: String },
    #[error("{path}: truncated shard: tensor `{tensor}` needs bytes up to {needed} of the data section but only {available} are present")]
    TruncatedShard {
        path: PathBuf,
        tensor: String,
        needed: usize,
        available: usize,
    },
    #[error("tensor `{tensor}` in {path}: unsupported dtype {dtype} (expected BF16, F16 or F32)")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("tensor `{tensor}`: listed in the shard index for {path} but not present there")]
    MissingFromShard { path: PathBuf, tensor: String },
    #[error("tensor `{tensor}` appears twice ({first} and {second})")]
    DuplicateTensor {
        tensor: String,
        first: String,
        second: String,
    },
    #[error("missing tensor `{tensor}`")]
    MissingTensor { tensor: String },
    #[error("unexpected tensor `{tensor}` (from {source_file}): not part of the Phi4MM layout for this config")]
    UnexpectedTensor { tensor: String, source_file: String },
    #[error("tensor `{tensor}`: shape {found:?}, but the config implies {expected:?}")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("LoRA tensor `{tensor}`: rank {found}, but the {adapter} adapter config says r = {expected}")]
    RankMismatch {
        tensor: String,
        adapter: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("incomplete LoRA pair: `{present}` is present but `{missing}` is missing")]
    IncompleteLoraPair { present: String, missing: String },
    #[error("LoRA tensor `{tensor}` has no base weight `{base}`")]
    LoraWithoutBase { tensor: String, base: String },
    #[error("tensor `{tensor}`: non-finite value {value} at flat index {index}")]
    NonFinite {
        tensor: String,
        index: usize,
        value: f32,
    },
}

pub type Result<T> = std::result::Result<T, CheckpointError>;
