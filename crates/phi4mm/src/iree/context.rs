//! What every IREE component shares: the compiler, the artifact cache and the device to run on.
//! Every module goes through [`IreeContext::module_bytes`], so every module is cached and verified
//! the same way, the decoder included.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use eerie::runtime::{DeviceSpec, Runtime};

use artifact_cache::{ArtifactCache, CacheEvent, CompilerIdentity, ModuleRequest};

use super::compiler::{CompileTarget, IreeCompiler};
use super::error::{IreeError, Result};
use super::mlir::Products;
use super::tiles::TileShape;
use super::weights::Weights;

pub struct IreeContext {
    pub cache: Arc<ArtifactCache>,
    pub compiler: IreeCompiler,
    /// The compiler of [`Rows::Few`] modules ([`IreeCompiler::for_few_rows`]) and its identity.
    few_rows: (IreeCompiler, CompilerIdentity),
    /// The compiler of [`Rows::Many`] modules ([`IreeCompiler::for_many_rows`]) and its identity.
    many_rows: (IreeCompiler, CompilerIdentity),
    /// HAL driver: `local-task` (default), `local-sync`, `cuda` where built.
    pub device: String,
    modules: Mutex<Vec<ModuleTiming>>,
}

/// How many rows a module's matrix products see per call, which decides how it is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// A decode step's handful (the decoder).
    Few,
    /// Hundreds to thousands (the audio and vision encoders).
    Many,
}

/// How one module was obtained: compiled now (cold) or loaded and verified from the cache.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModuleTiming {
    pub entry: String,
    pub compiled: bool,
    pub seconds: f64,
    pub bytes: usize,
}

impl IreeContext {
    /// Hashes the compiler library once (memoized in the cache directory) for every module.
    /// The compiler's target must be the device's kind ([`CompileTarget::for_device`]).
    pub fn new(cache: Arc<ArtifactCache>, compiler: IreeCompiler, device: &str) -> Result<Self> {
        let for_cuda = matches!(compiler.target(), CompileTarget::Cuda { .. });
        if for_cuda != (device == "cuda") {
            return Err(IreeError::Device {
                device: device.to_string(),
                message: format!(
                    "the modules are compiled for {:?}, which this device cannot run",
                    compiler.target()
                ),
            });
        }
        let few = compiler.for_few_rows();
        let few_identity = few.identity(&cache)?;
        let many = compiler.for_many_rows();
        let many_identity = many.identity(&cache)?;
        Ok(IreeContext {
            cache,
            compiler,
            few_rows: (few, few_identity),
            many_rows: (many, many_identity),
            device: device.to_string(),
            modules: Mutex::new(Vec::new()),
        })
    }

    /// How the encoders' modules hold their weights: in tiles on CPU ([`super::tiles`]: packed
    /// once at upload, where IREE's data tiling packed every weight again on every call), as
    /// stored on CUDA.
    pub fn encoder_products(&self) -> Products {
        match self.compiler.target() {
            CompileTarget::LlvmCpu { cpu } => Products::Tiles(TileShape::for_cpu(cpu)),
            CompileTarget::Cuda { .. } => Products::RowMajor,
        }
    }

    /// The compiled module for `entry`, from the cache or compiled now, compiled as `rows` says.
    pub fn module_bytes(
        &self,
        rows: Rows,
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
        let (compiler, identity) = match rows {
            Rows::Few => (&self.few_rows.0, &self.few_rows.1),
            Rows::Many => (&self.many_rows.0, &self.many_rows.1),
        };
        let t = Instant::now();
        let loaded = self
            .cache
            .load_or_compile(&req, identity, |src| {
                let retrying = |attempt: u32, why: &str| {
                    self.cache.progress().report(CacheEvent::Retrying {
                        entry,
                        attempt,
                        why,
                    })
                };
                compiler
                    .compile_reporting(src, &retrying)
                    .map_err(|e| e.to_string())
            })
            .map_err(|cause| IreeError::Module {
                entry: entry.to_string(),
                cause,
            })?;
        self.modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ModuleTiming {
                entry: entry.to_string(),
                compiled: loaded.compiled,
                seconds: t.elapsed().as_secs_f64(),
                bytes: loaded.bytes.len(),
            });
        Ok(loaded.bytes)
    }

    /// Every module this context obtained, in order, with how long it took.
    pub fn module_timings(&self) -> Vec<ModuleTiming> {
        self.modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A runtime on this context's device (call on the thread that will own it).
    pub fn runtime(device: &str) -> Result<Runtime> {
        Runtime::new(DeviceSpec::custom(device.to_string())).map_err(|e| IreeError::Device {
            device: device.to_string(),
            message: format!("{e}{}", device_hint(device)),
        })
    }
}

/// What an operator can do about a device that could not be created.
fn device_hint(device: &str) -> &'static str {
    match device {
        "cuda" if cfg!(feature = "cuda") => {
            " (IREE's CUDA driver loads the NVIDIA driver's `libcuda.so`, by that unversioned \
             name: where only libcuda.so.1 is installed, link libcuda.so to it on the library \
             path; and it needs a visible GPU: `nvidia-smi` shows both)"
        }
        "cuda" => " (this build has no CUDA driver: build the plugin with the `cuda` feature)",
        "local-sync" | "local-task" => "",
        _ => {
            " (devices: `local-sync`, `local-task`, and `cuda` in a build with the `cuda` feature)"
        }
    }
}
