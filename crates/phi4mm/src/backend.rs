//! Choosing and starting a backend: the pure-Rust host backend, or the IREE backend (cargo
//! feature `iree`). The plugin and the `phi4mm` tool both come through here, so `backend = "iree"`
//! in the TOML and `--backend iree` on the command line build the same thing.

use std::sync::Arc;

use crate::checkpoint::Checkpoint;
use crate::config::{BackendKind, IreeSettings};
use crate::model::{HostBackend, MediaStage, Phi4mm};
use crate::scheduler::{Detokenize, Scheduler, SchedulerConfig};
use crate::step::StepBackend;

/// A started backend: the scheduler driving its decoder and the media stage feeding it.
pub struct Running {
    pub scheduler: Scheduler,
    pub media: MediaStage,
    /// `host` or `iree`.
    pub name: &'static str,
    /// Backend facts for stats (`/admin/status`): for IREE the device and the artifact cache.
    pub details: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
}

/// Why a backend could not be chosen or started.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "backend \"iree\": this build of the phi4mm plugin has no IREE backend (build it with \
         `--features iree`)"
    )]
    IreeNotBuilt,
    #[error("cannot start the scheduler: {0}")]
    Scheduler(std::io::Error),
    #[cfg(feature = "iree")]
    #[error(transparent)]
    Iree(#[from] crate::iree::IreeError),
}

/// Resolves `auto` and refuses `iree` where this build cannot provide it.
pub fn resolve(kind: BackendKind, iree: &IreeSettings) -> Result<BackendKind, BackendError> {
    match kind {
        BackendKind::Host => Ok(BackendKind::Host),
        BackendKind::Iree if cfg!(feature = "iree") => Ok(BackendKind::Iree),
        BackendKind::Iree => Err(BackendError::IreeNotBuilt),
        BackendKind::Auto => {
            #[cfg(feature = "iree")]
            {
                if crate::iree::compiler::IreeCompiler::library(iree.compiler.as_deref()).is_ok() {
                    return Ok(BackendKind::Iree);
                }
            }
            let _ = iree;
            Ok(BackendKind::Host)
        }
    }
}

/// Starts the scheduler on the chosen backend. `model` is the host model: the host backend runs
/// on it, and every backend uses it for validation, embeddings and the placeholder merge.
pub fn start(
    kind: BackendKind,
    iree: &IreeSettings,
    ck: &Checkpoint,
    model: Arc<Phi4mm>,
    config: SchedulerConfig,
    detok: Option<Detokenize>,
) -> Result<Running, BackendError> {
    match resolve(kind, iree)? {
        #[cfg(feature = "iree")]
        BackendKind::Iree => {
            let backend = Arc::new(crate::iree::backend::IreeBackend::load(ck, model, iree)?);
            let media = backend.media_stage();
            let b = backend.clone();
            let details = Arc::new(move || b.details());
            run(backend, media, "iree", details, config, detok)
        }
        // Without the `iree` feature, `resolve` never answers `Iree`.
        _ => {
            let _ = ck; // only the IREE backend reads the checkpoint; the host model has it

            let backend = Arc::new(HostBackend(model));
            let media = backend.media_stage();
            let details = Arc::new(|| serde_json::json!({"backend": "host"}));
            run(backend, media, "host", details, config, detok)
        }
    }
}

/// Starts the scheduler's driver over `backend`.
fn run<B: StepBackend>(
    backend: Arc<B>,
    media: MediaStage,
    name: &'static str,
    details: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
    config: SchedulerConfig,
    detok: Option<Detokenize>,
) -> Result<Running, BackendError> {
    let scheduler = Scheduler::start(backend, config, detok).map_err(BackendError::Scheduler)?;
    Ok(Running {
        scheduler,
        media,
        name,
        details,
    })
}
