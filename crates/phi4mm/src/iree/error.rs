//! The IREE backend's errors. Each message is complete on its own: a wrapped error's text is part
//! of it (the wrapped error is kept as `cause`, not as a `source`, so a printer that walks sources
//! does not print it twice).

use std::path::PathBuf;

use artifact_cache::CacheError;

use crate::model::vision::ImageShapeError;

pub type Result<T, E = IreeError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum IreeError {
    /// A call into the IREE runtime failed: loading a module, finding a function, making a
    /// buffer, a call, or reading its results. eerie's errors hold raw IREE status pointers (not
    /// `Send`), so only their message is kept.
    #[error("{what}: {message}")]
    Runtime { what: String, message: String },
    #[error("IREE device `{device}`: {message}")]
    Device { device: String, message: String },
    #[error("IREE artifact cache {}: {cause}", dir.display())]
    CacheDir { dir: PathBuf, cause: CacheError },
    #[error("IREE module `{entry}`: {cause}")]
    Module { entry: String, cause: CacheError },
    /// Hashing the compiler library for the cache identity.
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("IREE compiler library {}: {cause}", path.display())]
    CompilerPath {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// No compiler named and none found in the active Python (the details say why).
    #[error(
        "no IREE compiler found ({0}): set `iree.compiler` (or PHI4MM_IREE_COMPILER) to a \
         libIREECompiler.so with iree-compile beside it, or install iree-base-compiler=={pkg} \
         into the active Python",
        pkg = crate::iree::compiler::PACKAGE_VERSION
    )]
    CompilerNotFound(String),
    #[error("IREE compiler revision: {0}")]
    CompilerRevision(String),
    /// A tool of the installation is missing: `iree-compile` (the driver), or `iree-lld` (the
    /// linker the driver runs for every CPU module).
    #[error(
        "IREE compiler tool {} not found: iree-base-compiler ships {tool} beside {}; install it \
         with the library",
        path.display(),
        library.display()
    )]
    CompilerTool {
        tool: &'static str,
        path: PathBuf,
        library: PathBuf,
    },
    /// The compiler refused a module or crashed (its diagnostics).
    #[error("{0}")]
    Compile(String),
    #[error(
        "the IREE compiler ({}) stalled on each of {attempts} attempts: it used no CPU time for \
         {limit_s:.1} s (the stall limit) and was killed; see \"a compile that stalls\" in \
         docs/operations.md",
        driver.display()
    )]
    CompilerStalled {
        driver: PathBuf,
        attempts: u32,
        limit_s: f64,
    },
    #[error(
        "the IREE compiler ({}) ran for {limit_s:.1} s, the compile time limit \
         (iree.compile_timeout_secs), and was killed; raise the limit for a very large module on \
         a slow machine (\"a compile that never ends\" in docs/operations.md)",
        driver.display()
    )]
    CompileTimedOut { driver: PathBuf, limit_s: f64 },
    #[error(transparent)]
    ImageShape(#[from] ImageShapeError),
    #[error("audio features shape: {values} values for {frames} frames of {width}")]
    AudioShape {
        values: usize,
        frames: usize,
        width: usize,
    },
}

/// eerie's runtime errors as [`IreeError::Runtime`], naming what was being done.
pub trait IreeResult<T> {
    fn iree(self, what: &str) -> Result<T>;
}

impl<T> IreeResult<T> for std::result::Result<T, eerie::runtime::RuntimeError> {
    fn iree(self, what: &str) -> Result<T> {
        self.map_err(|e| IreeError::Runtime {
            what: what.to_string(),
            message: e.to_string(),
        })
    }
}
