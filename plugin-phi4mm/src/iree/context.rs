//! What every IREE component shares: the compiler, the artifact cache and the device to run on.
//! Every module goes through [`IreeContext::module_bytes`], so every module is cached and verified
//! the same way, the decoder included.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use eerie::runtime::{DeviceSpec, Runtime};

use crate::artifact_cache::{ArtifactCache, CompilerIdentity, ModuleRequest};

use super::compiler::IreeCompiler;
use super::weights::Weights;

pub struct IreeContext {
    pub cache: Arc<ArtifactCache>,
    pub compiler: IreeCompiler,
    identity: CompilerIdentity,
    /// HAL driver: `local-sync` (default), `local-task`, `cuda` where built.
    pub device: String,
}

impl IreeContext {
    /// Hashes the compiler library once (memoized in the cache directory) for every module.
    pub fn new(cache: Arc<ArtifactCache>, compiler: IreeCompiler, device: &str) -> Result<Self> {
        let identity = compiler.identity(&cache)?;
        Ok(IreeContext {
            cache,
            compiler,
            identity,
            device: device.to_string(),
        })
    }

    /// The compiled module for `entry`, from the cache or compiled now.
    pub fn module_bytes(
        &self,
        entry: &str,
        config_identity: &str,
        mlir: &str,
        weights: &Weights,
    ) -> Result<Vec<u8>> {
        let req = ModuleRequest {
            entry,
            config_identity,
            mlir,
            weights: &weights.specs,
        };
        let loaded = self
            .cache
            .load_or_compile(&req, &self.identity, |src| self.compiler.compile(src))
            .with_context(|| format!("IREE module `{entry}`"))?;
        Ok(loaded.bytes)
    }

    /// A runtime on this context's device (call on the thread that will own it).
    pub fn runtime(device: &str) -> Result<Runtime> {
        Runtime::new(DeviceSpec::custom(device.to_string()))
            .map_err(|e| anyhow::anyhow!("IREE device `{device}`: {e}"))
    }
}

/// eerie's errors hold raw IREE status pointers (not `Send`); this turns them into messages.
pub trait IreeResult<T> {
    fn iree(self, what: &str) -> Result<T>;
}

impl<T> IreeResult<T> for std::result::Result<T, eerie::runtime::RuntimeError> {
    fn iree(self, what: &str) -> Result<T> {
        self.map_err(|e| anyhow::anyhow!("{what}: {e}"))
    }
}
