//! The IREE compiler: `libIREECompiler.so` from iree-base-compiler, and the `iree-compile` driver
//! beside it.
//!
//! Modules are compiled by the driver in a child process, watched for stalls and held to a time
//! limit (`compiler/driver.rs`). The library itself is never loaded into this process: the driver
//! loads it, and its revision (part of every module's cache identity) comes from
//! `iree-compile --version`. Loaded here, it added 56 MB of resident memory to a serving
//! process that never called it (`docs/benchmarks.md`), and it could be loaded only once per
//! process (IREE's global shutdown cannot be undone), so a reload could not move to another
//! compiler. An [`IreeCompiler`] value is an installation ([`CompilerLibrary`]) plus a target
//! ([`CompileTarget`]: the local CPU, or CUDA), cheap to create in any number.

mod discovery;
mod driver;

pub use discovery::{PACKAGE_VERSION, PYTHON_ENV};
pub use driver::{ATTEMPTS, STALL_LIMIT, TIME_LIMIT};

use artifact_cache::{resolve_target_cpu, ArtifactCache, CacheError, CompilerIdentity};

use super::error::{IreeError, Result};
use sha2::Digest as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use driver::{Driver, RunFailure, RunLimits};

/// Environment variable naming the compiler library (set by `scripts/iree-env.sh`).
pub const COMPILER_ENV: &str = "PHI4MM_IREE_COMPILER";

/// Environment variable holding extra compiler flags (whitespace-separated) for every module: a
/// way to measure IREE's options (a GPU pipeline, say) without a rebuild. They are part of each
/// module's cache identity, like every flag, so modules compiled with and without them never mix.
pub const EXTRA_FLAGS_ENV: &str = "PHI4MM_IREE_EXTRA_FLAGS";

/// The flags of [`EXTRA_FLAGS_ENV`], none when it is unset.
fn extra_flags_from_env() -> Vec<String> {
    std::env::var(EXTRA_FLAGS_ENV)
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// An IREE compiler installation: the library and the driver that compiles with it.
#[derive(Debug)]
pub struct CompilerLibrary {
    /// The library, canonical.
    path: PathBuf,
    version: String,
    driver: Driver,
}

impl CompilerLibrary {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The compiler's revision, e.g. `3.13.0rc20261016 @ 89ece87…`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The `iree-compile` that compiles modules with this library.
    pub fn driver(&self) -> &Path {
        self.driver.path()
    }
}

/// The installations found so far, by canonical library path: each is asked for its revision
/// once per process.
static FOUND: Mutex<Vec<Arc<CompilerLibrary>>> = Mutex::new(Vec::new());

/// Where to find the compiler library, in order of preference: `explicit`, then
/// [`COMPILER_ENV`], then the active Python's iree-base-compiler ([`discovery`]).
fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    match explicit
        .map(Path::to_owned)
        .or_else(|| std::env::var_os(COMPILER_ENV).map(PathBuf::from))
    {
        Some(path) => Ok(path),
        None => discovery::library_of_active_python(),
    }
}

/// What the modules are compiled for: chosen by the device they will run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileTarget {
    /// The local llvm-cpu backend (devices `local-sync`, `local-task`) for an LLVM CPU name
    /// (`host`, `generic`, `znver4`, ...).
    LlvmCpu { cpu: String },
    /// The CUDA backend (device `cuda`) for an NVPTX architecture (`sm_80`, ...).
    Cuda { arch: String },
}

impl CompileTarget {
    /// The target for `device`: `cuda` compiles for `cuda_arch`, every other device for the
    /// local CPU `target_cpu`.
    pub fn for_device(device: &str, target_cpu: &str, cuda_arch: &str) -> Self {
        if device == "cuda" {
            CompileTarget::Cuda {
                arch: cuda_arch.to_owned(),
            }
        } else {
            CompileTarget::LlvmCpu {
                cpu: target_cpu.to_owned(),
            }
        }
    }

    fn flags(&self) -> Vec<String> {
        match self {
            CompileTarget::LlvmCpu { cpu } => vec![
                "--iree-hal-target-device=local".into(),
                "--iree-hal-local-target-device-backends=llvm-cpu".into(),
                format!("--iree-llvmcpu-target-cpu={cpu}"),
                // FP reductions may be reassociated, as every SIMD dot product reassociates
                // them: kept in order, a reduction is one dependent chain of adds, and the
                // softmax max and sum over the vision tower's 16 × 1024 × 1024 scores ran
                // latency-bound (the tower 2 % slower; `docs/benchmarks.md`).
                format!("{REASSOCIATE}=true"),
            ],
            CompileTarget::Cuda { arch } => vec![
                "--iree-hal-target-device=cuda".into(),
                format!("--iree-cuda-target={arch}"),
            ],
        }
    }

    /// The target as the cache identity records it: the resolved CPU name (`host` means this
    /// machine's CPU), or `cuda:<arch>`.
    fn identity(&self) -> String {
        match self {
            CompileTarget::LlvmCpu { cpu } => resolve_target_cpu(cpu),
            CompileTarget::Cuda { .. } => self.to_string(),
        }
    }
}

impl std::fmt::Display for CompileTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileTarget::LlvmCpu { cpu } => write!(f, "llvm-cpu:{cpu}"),
            CompileTarget::Cuda { arch } => write!(f, "cuda:{arch}"),
        }
    }
}

/// The tuning spec for matrix-vector products on CPU ([`IreeCompiler::for_few_rows`]).
const MATVEC_CPU_SPEC: &str = include_str!("tuning/matvec_cpu.mlir");
const REASSOCIATE: &str = "--iree-llvmcpu-reassociate-fp-reductions";
const TUNING_SPEC: &str = "--iree-codegen-tuning-spec-path";

/// A compiler for one target: an installation plus the target's flags.
#[derive(Debug, Clone)]
pub struct IreeCompiler {
    library: Arc<CompilerLibrary>,
    target: CompileTarget,
    flags: Vec<String>,
    /// A transform-dialect tuning spec (MLIR text) handed to the compiler as a file.
    tuning_spec: Option<&'static str>,
    /// How long a compile may use no CPU time, and how long it may run, before it is killed.
    limits: RunLimits,
}

impl IreeCompiler {
    /// The compiler installation of `library` if given, else of `$PHI4MM_IREE_COMPILER`, else
    /// of the active Python's iree-base-compiler: its library, the driver beside it, and its
    /// revision.
    pub fn library(library: Option<&Path>) -> Result<Arc<CompilerLibrary>> {
        let requested = locate(library)?;
        let path = requested
            .canonicalize()
            .map_err(|cause| IreeError::CompilerPath {
                path: requested.clone(),
                cause,
            })?;
        let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = found.iter().find(|known| known.path == path) {
            return Ok(known.clone());
        }
        let driver = Driver::beside(&path)?;
        let version = driver.version()?;
        let installation = Arc::new(CompilerLibrary {
            path,
            version,
            driver,
        });
        found.push(installation.clone());
        Ok(installation)
    }

    /// A compiler for the local llvm-cpu backend and `target_cpu` (`host`, `generic`, or an
    /// LLVM CPU name such as `znver4`).
    pub fn new(library: Option<&Path>, target_cpu: &str) -> Result<Self> {
        let target = CompileTarget::LlvmCpu {
            cpu: target_cpu.to_owned(),
        };
        Self::for_target(library, target)
    }

    /// A compiler for `target`.
    pub fn for_target(library: Option<&Path>, target: CompileTarget) -> Result<Self> {
        let library = Self::library(library)?;
        let mut flags = target.flags();
        flags.extend(extra_flags_from_env());
        Ok(IreeCompiler {
            library,
            flags,
            target,
            tuning_spec: None,
            limits: RunLimits::default(),
        })
    }

    pub fn target(&self) -> &CompileTarget {
        &self.target
    }

    /// The compiler for modules whose matrix products see many rows per call (the encoders):
    /// on CPU, with IREE's data tiling and its ukernels, which pack both operands into tiles
    /// for the micro-kernels. Measured (`docs/benchmarks.md`, real-dimension towers): the audio
    /// encoder 1.75× faster. The decoder keeps the plain compiler: its weights are call
    /// arguments, and data tiling re-packs them on every call, which made a batch-8 decode step
    /// six times slower.
    pub fn for_many_rows(&self) -> Self {
        match self.target {
            CompileTarget::LlvmCpu { .. } => self.clone().with_extra_flags([
                "--iree-opt-data-tiling".to_string(),
                "--iree-llvmcpu-enable-ukernels=all".to_string(),
            ]),
            CompileTarget::Cuda { .. } => self.clone(),
        }
    }

    /// The compiler for modules whose matrix products see a handful of rows per call (the
    /// decoder): on CPU, its matrix-vector products (batch-1 decode, the LM head) get the
    /// lowering of `tuning/matvec_cpu.mlir`, one accumulator per output row instead of IREE's
    /// default tiles that transpose in registers (measured: the LM head 2.5–2.8× faster; the
    /// spec relies on the reassociated reductions every CPU compile allows).
    pub fn for_few_rows(&self) -> Self {
        match self.target {
            CompileTarget::LlvmCpu { .. } => {
                let mut c = self.clone();
                c.tuning_spec = Some(MATVEC_CPU_SPEC);
                c
            }
            CompileTarget::Cuda { .. } => self.clone(),
        }
    }

    /// The same compiler with another stall limit (tests: [`STALL_LIMIT`] is a minute).
    pub fn with_stall_limit(mut self, limit: Duration) -> Self {
        self.limits.stall = limit;
        self
    }

    /// The same compiler with another limit on one compile's running time (`iree.compile_timeout_secs`;
    /// default [`TIME_LIMIT`]).
    pub fn with_time_limit(mut self, limit: Duration) -> Self {
        self.limits.time = limit;
        self
    }

    /// The same compiler with `extra` flags appended (they are part of the cache identity).
    pub fn with_extra_flags(mut self, extra: impl IntoIterator<Item = String>) -> Self {
        self.flags.extend(extra);
        self
    }

    pub fn flags(&self) -> &[String] {
        &self.flags
    }

    pub fn library_info(&self) -> &CompilerLibrary {
        &self.library
    }

    /// The compiler identity recorded in the cache: library sha256 (memoized in the cache dir),
    /// version, flags (a tuning spec as the sha256 of its text, since the file it is written to
    /// is temporary), and the resolved target CPU.
    pub fn identity(&self, cache: &ArtifactCache) -> Result<CompilerIdentity, CacheError> {
        let mut flags = self.flags.clone();
        if let Some(spec) = self.tuning_spec {
            let digest = sha2::Sha256::digest(spec.as_bytes());
            flags.push(format!("{TUNING_SPEC}=<sha256 {digest:x}>"));
        }
        Ok(CompilerIdentity {
            library_sha256: cache.file_sha256(&self.library.path)?,
            version: self.library.version.clone(),
            flags,
            target_cpu: self.target.identity(),
        })
    }

    /// Compiles MLIR text to a VM flatbuffer module (see [`IreeCompiler::compile_reporting`]).
    pub fn compile(&self, mlir: &str) -> Result<Vec<u8>> {
        self.compile_reporting(mlir, &|_, _| {})
    }

    /// Compiles MLIR text to a VM flatbuffer module in an `iree-compile` child (`driver.rs`). A
    /// run that stalls is killed and run again, up to [`ATTEMPTS`] runs; before each new run
    /// `retrying(attempt, why)` is told. A run that reaches the time limit is killed and is an
    /// error at once: unlike the deadlock, a compile that computes that long would do so again.
    ///
    /// With `PHI4MM_IREE_DUMP_DIR` set, the MLIR text is also written there as `<sha256>.mlir`,
    /// with the compile's flags beside it (`<sha256>.flags`, one per line; a tuning spec as
    /// `<sha256>.tuning.mlir`), so the module can be compiled again by hand exactly as here:
    /// `iree-compile --compile-to=flow`, or `scripts/profile-iree-dispatches.sh`.
    pub fn compile_reporting(&self, mlir: &str, retrying: &dyn Fn(u32, &str)) -> Result<Vec<u8>> {
        if let Some(dir) = std::env::var_os("PHI4MM_IREE_DUMP_DIR") {
            if let Err(e) = self.dump(Path::new(&dir), mlir) {
                eprintln!("PHI4MM_IREE_DUMP_DIR: the MLIR was not written: {e}");
            }
        }
        let driver = &self.library.driver;
        for attempt in 1..=ATTEMPTS {
            if attempt > 1 {
                let why = format!(
                    "the IREE compiler used no CPU time for {:.1} s (the stall limit) and was \
                     killed",
                    self.limits.stall.as_secs_f64()
                );
                retrying(attempt, &why);
            }
            match driver.run(mlir, &self.flags, self.tuning_spec, self.limits) {
                Ok(module) => return Ok(module),
                Err(RunFailure::Failed(diagnostics)) => {
                    return Err(IreeError::Compile(diagnostics))
                }
                Err(RunFailure::TimedOut) => {
                    return Err(IreeError::CompileTimedOut {
                        driver: driver.path().to_owned(),
                        limit_s: self.limits.time.as_secs_f64(),
                    })
                }
                Err(RunFailure::Stalled) => {}
            }
        }
        Err(IreeError::CompilerStalled {
            driver: driver.path().to_owned(),
            attempts: ATTEMPTS,
            limit_s: self.limits.stall.as_secs_f64(),
        })
    }

    /// Writes `mlir` and the flags that compile it into `dir` (see [`IreeCompiler::compile`]).
    fn dump(&self, dir: &Path, mlir: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let stem = format!("{:x}", sha2::Sha256::digest(mlir.as_bytes()));
        std::fs::write(dir.join(format!("{stem}.mlir")), mlir)?;
        let spec_path = match self.tuning_spec {
            Some(spec) => {
                let path = dir.join(format!("{stem}.tuning.mlir"));
                std::fs::write(&path, spec)?;
                Some(path)
            }
            None => None,
        };
        let mut flags = self.flags.clone();
        flags.extend(spec_path.map(|path| format!("{TUNING_SPEC}={}", path.display())));
        std::fs::write(dir.join(format!("{stem}.flags")), flags.join("\n") + "\n")
    }
}
