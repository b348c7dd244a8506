//! Shared setup of the IREE tests: one artifact cache for the whole test run (under cargo's
//! target tmp dir, so later runs start warm) and the decoder built on it.
//!
//! The suite runs on the device that `PHI4MM_TEST_IREE_DEVICE` names: `local-sync` (the
//! default, every CI machine), or `cuda` on a machine with an NVIDIA GPU (a build with the
//! `cuda` feature), where the same cases and tolerances then hold for the CUDA modules.

use std::sync::{Arc, OnceLock};

use artifact_cache::{ArtifactCache, Progress};
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::config::IreeSettings;
use switchyard_phi4mm::iree::backend::IreeBackend;
use switchyard_phi4mm::iree::compiler::{CompileTarget, IreeCompiler};
use switchyard_phi4mm::iree::context::IreeContext;
use switchyard_phi4mm::iree::decoder::IreeDecoder;
use switchyard_phi4mm::model::Phi4mm;

use crate::model_support::fixture;

/// Tokens per prefill call.
pub const CHUNK: usize = 64;

/// The IREE device the suite runs on (see the module doc).
pub fn device() -> &'static str {
    static DEVICE: OnceLock<String> = OnceLock::new();
    DEVICE.get_or_init(|| {
        std::env::var("PHI4MM_TEST_IREE_DEVICE").unwrap_or_else(|_| "local-sync".into())
    })
}

pub fn context() -> &'static IreeContext {
    static CTX: OnceLock<IreeContext> = OnceLock::new();
    CTX.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("iree-cache");
        let cache = ArtifactCache::open(dir).expect("artifact cache");
        let defaults = IreeSettings::default();
        let target = CompileTarget::for_device(device(), "host", &defaults.cuda_target);
        let compiler = IreeCompiler::for_target(None, target).expect("IREE compiler");
        IreeContext::new(Arc::new(cache), compiler, device()).expect("IREE context")
    })
}

pub fn decoder(layout: &str) -> IreeDecoder {
    let ck = Checkpoint::open(&fixture().join(layout)).expect("fixture checkpoint");
    // Rows up to the checkpoint's whole context, as served: no context setting.
    let positions = ck.config.text.max_position_embeddings;
    IreeDecoder::load(&ck, context(), positions, CHUNK).expect("IREE decoder")
}

/// The whole IREE backend on the shared cache, built for the same decoder shape as [`decoder`].
pub fn backend(ck: &Checkpoint, host: Arc<Phi4mm>) -> IreeBackend {
    let settings = IreeSettings {
        cache_dir: Some(context().cache.dir().to_path_buf()),
        prefill_chunk: CHUNK,
        device: device().to_string(),
        ..IreeSettings::default()
    };
    IreeBackend::load(ck, host, &settings, Progress::none()).expect("IREE backend")
}
