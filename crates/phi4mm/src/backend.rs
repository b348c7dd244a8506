//! Choosing and starting a backend: the pure-Rust host backend, or the IREE backend (cargo
//! feature `iree`). The plugin and the `phi4mm` tool both come through here, so `backend = "iree"`
//! in the TOML and `--backend iree` on the command line build the same thing. The producer of the
//! token embeddings and image rows (`producer = "mlx"`, cargo feature `mlx`) is put in front of
//! the backend's media stage here too.

use std::sync::Arc;

use artifact_cache::Progress;

use crate::checkpoint::Checkpoint;
use crate::config::{BackendKind, IreeSettings, ProducerKind};
use crate::model::{HostBackend, MediaEncoders, MediaStage, Phi4mm};
use crate::scheduler::{Detokenize, Scheduler, SchedulerConfig};
use crate::step::StepBackend;

/// Which backend and producer to start, and where the artifact cache's events go (the IREE
/// backend compiles its modules on a cold cache, for minutes on the real checkpoint; the host
/// backend compiles nothing).
pub struct BackendChoice<'a> {
    pub kind: BackendKind,
    pub producer: ProducerKind,
    pub iree: &'a IreeSettings,
    /// The CLI draws a spinner; the plugin writes each event into the host's log.
    pub compiles: Progress,
}

/// A started backend: the scheduler driving its decoder and the media stage feeding it.
pub struct Running {
    pub scheduler: Scheduler,
    pub media: MediaStage,
    /// `host` or `iree`.
    pub name: &'static str,
    /// `host` or `mlx`.
    pub producer: &'static str,
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
    #[error(
        "producer \"mlx\": this build of the phi4mm plugin has no MLX producer (build it with \
         `--features mlx`)"
    )]
    MlxNotBuilt,
    #[error("cannot start the scheduler: {0}")]
    Scheduler(std::io::Error),
    #[cfg(feature = "iree")]
    #[error(transparent)]
    Iree(#[from] crate::iree::IreeError),
    #[cfg(feature = "mlx")]
    #[error(transparent)]
    Mlx(#[from] crate::mlx::MlxError),
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

/// Refuses a backend or a producer that this build lacks, before anything is loaded (the
/// settings check; [`start`] refuses the same).
pub fn check_available(
    kind: BackendKind,
    producer: ProducerKind,
    iree: &IreeSettings,
) -> Result<(), BackendError> {
    let resolved = resolve(kind, iree)?;
    // The IREE backend needs its compiler whatever the cache holds (the compiler's identity
    // names every module): a check that did not look for it passed what creation refused.
    #[cfg(feature = "iree")]
    if resolved == BackendKind::Iree {
        crate::iree::compiler::IreeCompiler::library(iree.compiler.as_deref())?;
    }
    let _ = resolved;
    if producer == ProducerKind::Mlx && !cfg!(feature = "mlx") {
        return Err(BackendError::MlxNotBuilt);
    }
    Ok(())
}

/// The producer in front of a backend's `encoders`: for `mlx`, MLX's embeddings and image rows
/// over the backend's audio encoder, qualified against the host model first (no fallback: an MLX
/// that cannot start or qualify is an error). Answers the encoders and the producer's name.
pub fn producer_encoders(
    producer: ProducerKind,
    ck: &Checkpoint,
    model: &Arc<Phi4mm>,
    encoders: Arc<dyn MediaEncoders + Send + Sync>,
) -> Result<(Arc<dyn MediaEncoders + Send + Sync>, &'static str), BackendError> {
    match producer {
        ProducerKind::Host => Ok((encoders, "host")),
        #[cfg(feature = "mlx")]
        ProducerKind::Mlx => {
            let mlx = crate::mlx::MlxProducer::start(ck, model.clone(), encoders)?;
            Ok((Arc::new(mlx), "mlx"))
        }
        #[cfg(not(feature = "mlx"))]
        ProducerKind::Mlx => {
            let _ = (ck, model, encoders);
            Err(BackendError::MlxNotBuilt)
        }
    }
}

/// [`producer_encoders`] for a backend's media stage.
fn with_producer(
    producer: ProducerKind,
    ck: &Checkpoint,
    model: &Arc<Phi4mm>,
    media: MediaStage,
) -> Result<(MediaStage, &'static str), BackendError> {
    let (encoders, name) = producer_encoders(producer, ck, model, media.encoders())?;
    Ok((media.with_encoders(encoders), name))
}

/// Starts the scheduler on the chosen backend. `model` is the host model: the host backend runs
/// on it, and every backend uses it for validation, embeddings and the placeholder merge.
pub fn start(
    choice: BackendChoice<'_>,
    ck: &Checkpoint,
    model: Arc<Phi4mm>,
    config: SchedulerConfig,
    detok: Option<Detokenize>,
) -> Result<Running, BackendError> {
    let BackendChoice {
        kind,
        producer,
        iree,
        compiles,
    } = choice;
    match resolve(kind, iree)? {
        #[cfg(feature = "iree")]
        BackendKind::Iree => {
            let backend = Arc::new(crate::iree::backend::IreeBackend::load(
                ck,
                model.clone(),
                iree,
                compiles,
            )?);
            let (media, producer) = with_producer(producer, ck, &model, backend.media_stage())?;
            let b = backend.clone();
            let details = Arc::new(move || b.details());
            run(backend, media, "iree", producer, details, config, detok)
        }
        // Without the `iree` feature, `resolve` never answers `Iree`.
        _ => {
            drop(compiles);
            let (media, producer) = with_producer(
                producer,
                ck,
                &model,
                HostBackend(model.clone()).media_stage(),
            )?;
            let backend = Arc::new(HostBackend(model));
            let details = Arc::new(|| serde_json::json!({"backend": "host"}));
            run(backend, media, "host", producer, details, config, detok)
        }
    }
}

/// Starts the scheduler's driver over `backend`.
fn run<B: StepBackend>(
    backend: Arc<B>,
    media: MediaStage,
    name: &'static str,
    producer: &'static str,
    details: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
    config: SchedulerConfig,
    detok: Option<Detokenize>,
) -> Result<Running, BackendError> {
    let scheduler = Scheduler::start(backend, config, detok).map_err(BackendError::Scheduler)?;
    Ok(Running {
        scheduler,
        media,
        name,
        producer,
        details,
    })
}
