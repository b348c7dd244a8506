//! The IREE backend as the scheduler and the plugin see it: the compiled decoder behind
//! [`StepBackend`], the compiled encoders behind the media stage, and the host model for what is
//! not compute (validation, token embeddings, the placeholder merge).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::adapter::AudioBranch;
use crate::checkpoint::Checkpoint;
use crate::config::IreeSettings;
use crate::model::{
    AudioEncoding, EncoderError, ImageEncoding, ImageInput, MediaEncoders, MediaStage, Phi4mm,
};
use crate::step::{StepBackend, StepRow};
use artifact_cache::{ArtifactCache, Progress};

use super::audio::IreeAudio;
use super::compiler::IreeCompiler;
use super::context::{IreeContext, ModuleTiming};
use super::decoder::{IreeDecoder, IreeSequence};
use super::emit::decoder::DecoderShape;
use super::error::{IreeError, Result};
use super::vision::IreeVision;

pub struct IreeBackend {
    host: Arc<Phi4mm>,
    decoder: IreeDecoder,
    encoders: Arc<IreeEncoders>,
    ctx: Arc<IreeContext>,
}

/// The compiled vision tower and audio encoder, each on its own runtime thread.
pub struct IreeEncoders {
    pub vision: IreeVision,
    pub audio: IreeAudio,
}

impl MediaEncoders for IreeEncoders {
    fn encode_image(&self, image: &ImageInput) -> Result<ImageEncoding, EncoderError> {
        Ok(self.vision.encode(image)?)
    }

    fn encode_audio(
        &self,
        features: &[f32],
        frames: usize,
        branch: AudioBranch,
    ) -> Result<AudioEncoding, EncoderError> {
        Ok(self.audio.encode(features, frames, branch)?)
    }
}

/// The artifact cache, compiler and device `settings` name, as every module of the backend uses
/// them, with the cache's events (compiles, waits, rebuilds) reported to `progress`. Creates no
/// device.
fn context(settings: &IreeSettings, progress: Progress) -> Result<IreeContext> {
    let dir: PathBuf = settings
        .cache_dir
        .clone()
        .unwrap_or_else(ArtifactCache::default_dir);
    let cache = ArtifactCache::open(&dir)
        .map_err(|cause| IreeError::CacheDir {
            dir: dir.clone(),
            cause,
        })?
        .with_progress(progress);
    let compiler =
        IreeCompiler::for_target(settings.compiler.as_deref(), settings.compile_target())?
            .with_time_limit(Duration::from_secs(settings.compile_timeout_secs));
    IreeContext::new(Arc::new(cache), compiler, &settings.device)
}

/// The longest row the decoder is compiled for: the setting, else the checkpoint's whole context.
fn decoder_context(ck: &Checkpoint, settings: &IreeSettings) -> usize {
    settings
        .context
        .unwrap_or(ck.config.text.max_position_embeddings)
}

/// The longest prompt plus new tokens that [`IreeBackend::load`]'s decoder for `ck` and
/// `settings` will hold, known without compiling anything: a prompt that cannot fit is refused
/// before the minutes of a cold compile.
pub fn decoder_positions(ck: &Checkpoint, settings: &IreeSettings) -> usize {
    DecoderShape::new(
        decoder_context(ck, settings),
        settings.prefill_chunk,
        super::decoder::DECODE_BATCHES,
    )
    .context()
}

/// Puts every module that [`IreeBackend::load`] would load for `ck` and `settings` into the
/// artifact cache, compiling those it lacks, without creating the device: a cache can be warmed
/// for `iree.device = "cuda"` on a machine without a GPU, and a serving process then finds
/// every module there. Returns how each module was obtained.
pub fn warm_cache(
    ck: &Checkpoint,
    settings: &IreeSettings,
    progress: Progress,
) -> Result<Vec<ModuleTiming>> {
    let ctx = context(settings, progress)?;
    let shape = IreeDecoder::shape(decoder_context(ck, settings), settings.prefill_chunk, &ctx);
    IreeDecoder::module(ck, &ctx, &shape)?;
    IreeVision::module(ck, &ctx)?;
    IreeAudio::module(ck, &ctx)?;
    Ok(ctx.module_timings())
}

impl IreeBackend {
    /// Compiles (or loads from the artifact cache) every module and uploads the weights. The
    /// cache's events go to `progress`: a spinner in the CLI, the host's log in a server.
    pub fn load(
        ck: &Checkpoint,
        host: Arc<Phi4mm>,
        settings: &IreeSettings,
        progress: Progress,
    ) -> Result<Self> {
        let ctx = Arc::new(context(settings, progress)?);
        let decoder = IreeDecoder::load(
            ck,
            &ctx,
            decoder_context(ck, settings),
            settings.prefill_chunk,
        )?;
        let encoders = Arc::new(IreeEncoders {
            vision: IreeVision::load(ck, &ctx)?,
            audio: IreeAudio::load(ck, &ctx)?,
        });
        Ok(IreeBackend {
            host,
            decoder,
            encoders,
            ctx,
        })
    }

    pub fn encoders(&self) -> &IreeEncoders {
        &self.encoders
    }

    /// Validation and the placeholder merge on the host model, the encoders on IREE, within the
    /// compiled decoder's context.
    pub fn media_stage(&self) -> MediaStage {
        MediaStage::new(self.host.clone(), self.encoders.clone(), self.context())
    }

    /// Longest prompt + new tokens a row can hold.
    pub fn context(&self) -> usize {
        self.decoder.context()
    }

    /// Device and artifact-cache facts for `/admin/status`.
    pub fn details(&self) -> serde_json::Value {
        let entries = self.ctx.cache.list().map(|l| l.len()).unwrap_or(0);
        serde_json::json!({
            "backend": "iree",
            "device": self.ctx.device,
            "context": self.decoder.context(),
            "cache_sizes": self.decoder.cache_sizes(),
            "cache": {
                "dir": self.ctx.cache.dir().display().to_string(),
                "entries": entries,
                "compiles_this_process": self.ctx.cache.compiles(),
            },
            "modules": self.ctx.module_timings(),
        })
    }
}

impl StepBackend for IreeBackend {
    type State = IreeSequence;

    fn new_state(&self) -> IreeSequence {
        self.decoder.new_state()
    }

    fn embed(&self, ids: &[u32]) -> Vec<f32> {
        self.decoder.embed(ids)
    }

    fn step(&self, rows: &mut [StepRow<'_, IreeSequence>]) -> Vec<Vec<f32>> {
        self.decoder.step(rows)
    }

    fn kv_bytes(&self, positions: usize) -> usize {
        self.decoder.kv_bytes(positions)
    }

    fn prefill_granularity(&self) -> usize {
        self.decoder.prefill_granularity()
    }
}
