//! Why a reload was refused. Each message names the config key, model or plugin at fault; the
//! admin endpoint maps the variants to status codes.

use crate::{config::ConfigErrors, registry::RegistryError};

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    #[error("{0}")]
    Plugin(#[from] RegistryError),
    #[error("models[{index}] ({name}): plugin {plugin} has no model kind {kind:?} (it has {available:?})")]
    UnknownKind {
        index: usize,
        name: String,
        plugin: String,
        kind: String,
        available: Vec<String>,
    },
    #[error("models[{index}] ({name}): settings refused by the plugin's check: {message}")]
    Settings {
        index: usize,
        name: String,
        message: String,
    },
    #[error("models[{index}] ({name}): the plugin's settings check did not finish within reload_timeout_secs = {secs}; the models after it were not checked")]
    CheckTimeout {
        index: usize,
        name: String,
        secs: f64,
    },
    #[error("models[{index}] ({name}): creation failed: {message}")]
    Create {
        index: usize,
        name: String,
        message: String,
    },
    #[error("models[{index}] ({name}): warm-up failed: {message}")]
    Warm {
        index: usize,
        name: String,
        message: String,
    },
    #[error("models[{index}] ({name}): creation and warm-up did not finish within reload_timeout_secs = {secs}")]
    Timeout {
        index: usize,
        name: String,
        secs: f64,
    },
    #[error("no config file to reload from")]
    NoSource,
    #[error("the server is shutting down (SIGTERM); reloads are refused")]
    ShuttingDown,
}
