//! The verified, crash-safe cache of compiled IREE modules (see `docs/operations.md`, "IREE
//! artifact cache", and `docs/phi4mm-model.md` §12.6).
//!
//! - Identity ([`identity`]): sha256 over entry, config identity, compiler identity, MLIR sha256
//!   and weight schema, in that order. The key names the files (`layout.rs`).
//! - Load: read manifest and module once; every identity field must equal the request's and the
//!   module's sha256 the manifest's; only then are *those same bytes* returned. Anything else is
//!   rebuilt, never loaded.
//! - Publication: compile under the entry's flock (`lock.rs`); re-check after acquiring (someone
//!   may have published meanwhile); module then manifest, each via temp file + fsync + rename.
//! - Stale temp files are swept by lock state, not age (`sweep.rs`).
//!
//! Plain files, hashes and locks: no dependency on the IREE crates (or on any other workspace
//! crate), so the `phi4mm cache` CLI and the plugin's stats work without the `iree` feature, and
//! any plugin that compiles modules can use it. It never prints: what a user should see (waiting,
//! rebuilding, compiling) goes to the [`Progress`] callback its owner installs.

pub mod identity;
mod invalid;
mod layout;
mod library_hash;
mod lock;
pub mod manifest;
mod progress;
mod sweep;

pub use identity::{
    resolve_target_cpu, sha256_hex, CompilerIdentity, Identity, ModuleRequest, WeightSpec,
};
pub use invalid::Invalid;
pub use manifest::Manifest;
pub use progress::{CacheEvent, Progress};

use layout::{parse_entry_file, EntryPaths};
use lock::FileLock;
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    // Not a `source`: its text is in the message already.
    #[error("artifact cache: {}: {cause}", path.display())]
    Io { path: PathBuf, cause: io::Error },
    #[error("artifact cache: invalid entry name {0:?} (use ASCII letters, digits, '.', '_', '-')")]
    InvalidEntry(String),
    #[error("compiling {entry}: {message}")]
    Compile { entry: String, message: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |cause| CacheError::Io {
        path: path.to_owned(),
        cause,
    }
}

/// A module as returned by [`ArtifactCache::load_or_compile`].
#[derive(Debug, Clone)]
pub struct LoadedArtifact {
    /// The module bytes: exactly the bytes that were verified against the manifest (or that this
    /// call compiled and published).
    pub bytes: Vec<u8>,
    pub manifest: Manifest,
    /// True if this call compiled the module; false if it was loaded from the cache.
    pub compiled: bool,
}

/// One entry found in the cache directory (valid or not), for `cache ls` and stats.
#[derive(Debug, Clone)]
pub struct EntryInfo {
    pub entry: String,
    pub key: String,
    pub module_path: PathBuf,
    pub manifest_path: PathBuf,
    /// Size of the module file; `None` if it is missing.
    pub module_size: Option<u64>,
    /// The strictly parsed manifest, or why there is none.
    pub manifest: Result<Manifest, Invalid>,
}

/// One entry and the outcome of checking it (`Err` says why it is invalid).
pub type Verified = (EntryInfo, Result<(), Invalid>);

/// What [`ArtifactCache::gc`] removes besides what is always removed (invalid entries, modules
/// without a manifest, unused lock files, stale temp files).
#[derive(Debug, Clone, Default)]
pub struct GcOptions {
    /// Also remove valid entries published longer ago than this.
    pub older_than: Option<Duration>,
    /// Also remove valid entries built by a compiler whose version string differs from this.
    pub keep_compiler_version: Option<String>,
    /// Also remove valid entries built by any other compiler identity (library, version, flags
    /// or target CPU): what the running backend would never load again.
    pub keep_compiler: Option<CompilerIdentity>,
}

#[derive(Debug, Clone, Default)]
pub struct GcReport {
    /// Each removed file and why.
    pub removed: Vec<(PathBuf, String)>,
    /// Entries left alone because someone holds their lock (compiling or loading right now).
    pub busy: Vec<String>,
}

#[derive(Debug)]
pub struct ArtifactCache {
    dir: PathBuf,
    compiles: AtomicU64,
    /// Temp files `open` swept, not yet reported by `gc`.
    swept_on_open: Mutex<Vec<PathBuf>>,
    progress: Progress,
}

/// Outcome of reading an entry without the lock.
enum Probe {
    Valid(Vec<u8>, Box<Manifest>),
    Missing,
    Invalid(Invalid),
}

impl ArtifactCache {
    /// Opens (creating if needed) the cache directory and sweeps temp files left by dead writers.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, CacheError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let swept = sweep::sweep_stale(&dir).map_err(io_err(&dir))?;
        Ok(ArtifactCache {
            dir,
            compiles: AtomicU64::new(0),
            swept_on_open: Mutex::new(swept),
            progress: Progress::none(),
        })
    }

    /// Sends what a user should see of this cache's work (waiting for another compiler,
    /// rebuilding an invalid entry, compiling) to `progress` instead of nowhere.
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Where this cache's events go, for a compiler reporting on its own work
    /// ([`CacheEvent::Retrying`]).
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Opens an existing cache directory without changing anything in it (no sweep), for
    /// inspection: `list` and `verify` (`phi4mm cache ls|verify`).
    pub fn inspect(dir: impl Into<PathBuf>) -> Result<Self, CacheError> {
        let dir = dir.into();
        if !dir.is_dir() {
            return Err(io_err(&dir)(io::Error::new(
                io::ErrorKind::NotFound,
                "no cache directory",
            )));
        }
        Ok(ArtifactCache {
            dir,
            compiles: AtomicU64::new(0),
            swept_on_open: Mutex::new(Vec::new()),
            progress: Progress::none(),
        })
    }

    /// `$XDG_CACHE_HOME/switchyard/iree`, else `~/.cache/switchyard/iree`. Never the shared
    /// system temp directory: other users could plant modules there.
    pub fn default_dir() -> PathBuf {
        dirs::cache_dir()
            .or_else(|| dirs::home_dir().map(|h| h.join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"))
            .join("switchyard")
            .join("iree")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many compiles this `ArtifactCache` value has run.
    pub fn compiles(&self) -> u64 {
        self.compiles.load(Ordering::SeqCst)
    }

    /// sha256 of a compiler library (or any large file), memoized in the cache dir by path, size,
    /// mtime, ctime and inode.
    pub fn file_sha256(&self, file: &Path) -> Result<String, CacheError> {
        library_hash::file_sha256(&self.dir, file).map_err(io_err(file))
    }

    /// Returns the verified cached module for `req`, or compiles it with `compile` (given the
    /// MLIR text) and publishes it. At most one compile per identity runs at a time across all
    /// threads and processes sharing the directory; the others wait for it and load its result.
    pub fn load_or_compile(
        &self,
        req: &ModuleRequest,
        compiler: &CompilerIdentity,
        compile: impl FnOnce(&str) -> Result<Vec<u8>, String>,
    ) -> Result<LoadedArtifact, CacheError> {
        if !identity::valid_entry_name(req.entry) {
            return Err(CacheError::InvalidEntry(req.entry.to_owned()));
        }
        let identity = Identity::new(req, compiler);
        let key = identity.key();
        let paths = EntryPaths::new(&self.dir, req.entry, &key);

        // Fast path, no lock: publication is atomic and the manifest names the bytes' hash, so a
        // concurrent rebuild can at worst make this read look invalid, never wrong.
        if let Probe::Valid(bytes, manifest) = probe(&paths, &identity) {
            return Ok(LoadedArtifact {
                bytes,
                manifest: *manifest,
                compiled: false,
            });
        }

        let _lock = FileLock::acquire(&paths.lock, || {
            self.progress
                .report(CacheEvent::Waiting { entry: req.entry })
        })
        .map_err(io_err(&paths.lock))?;

        // Someone may have published while we waited.
        match probe(&paths, &identity) {
            Probe::Valid(bytes, manifest) => {
                return Ok(LoadedArtifact {
                    bytes,
                    manifest: *manifest,
                    compiled: false,
                })
            }
            Probe::Missing => {}
            Probe::Invalid(why) => self.progress.report(CacheEvent::Rebuilding {
                entry: req.entry,
                why: &why,
            }),
        }
        // We hold the lock, so every temp file of this stem belongs to a dead writer.
        sweep::sweep_stem_locked(&self.dir, &paths.stem).map_err(io_err(&self.dir))?;

        // Compile "into a temp file": the temp exists (and is swept if we die) from before the
        // compile until its atomic rename.
        let module_tmp = layout::temp_file(&self.dir, &paths.stem).map_err(io_err(&self.dir))?;
        self.compiles.fetch_add(1, Ordering::SeqCst);
        self.progress
            .report(CacheEvent::Compiling { entry: req.entry });
        let started = std::time::Instant::now();
        let compiled = compile(req.mlir);
        self.progress.report(CacheEvent::Compiled {
            entry: req.entry,
            elapsed: started.elapsed(),
            ok: compiled.is_ok(),
        });
        let bytes = compiled.map_err(|message| CacheError::Compile {
            entry: req.entry.to_owned(),
            message,
        })?;
        let manifest = Manifest::new(identity, &bytes);
        layout::publish(module_tmp, &bytes, &paths.module).map_err(io_err(&paths.module))?;
        let manifest_tmp = layout::temp_file(&self.dir, &paths.stem).map_err(io_err(&self.dir))?;
        layout::publish(manifest_tmp, &manifest.to_json(), &paths.manifest)
            .map_err(io_err(&paths.manifest))?;
        Ok(LoadedArtifact {
            bytes,
            manifest,
            compiled: true,
        })
    }

    /// Every entry in the directory (anything with an entry-shaped `.vmfb` or `.json` name),
    /// sorted by entry name then key.
    pub fn list(&self) -> Result<Vec<EntryInfo>, CacheError> {
        Ok(self
            .stems(false)?
            .into_iter()
            .map(|stem| self.info(stem))
            .collect())
    }

    /// Checks every entry fully (strict manifest, names, module length and sha256).
    pub fn verify(&self) -> Result<Vec<Verified>, CacheError> {
        Ok(self
            .list()?
            .into_iter()
            .map(|info| {
                let check = check_entry(&info).map(|_| ());
                (info, check)
            })
            .collect())
    }

    /// Removes invalid entries, modules without a manifest, unused lock files and stale temp
    /// files, plus whatever `opts` asks for. Each entry is examined and removed under its lock,
    /// so an entry being compiled or published right now is skipped (reported as busy), never
    /// torn down under its writer.
    pub fn gc(&self, opts: &GcOptions) -> Result<GcReport, CacheError> {
        let mut report = GcReport::default();
        let mut swept =
            std::mem::take(&mut *self.swept_on_open.lock().unwrap_or_else(|e| e.into_inner()));
        swept.extend(sweep::sweep_stale(&self.dir).map_err(io_err(&self.dir))?);
        for t in swept {
            report.removed.push((t, "stale temp file".into()));
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        for stem in self.stems(true)? {
            let paths = EntryPaths::for_stem(&self.dir, stem.clone());
            let Some(lock) =
                FileLock::try_acquire_existing(&paths.lock).map_err(io_err(&paths.lock))?
            else {
                if paths.lock.exists() {
                    report.busy.push(stem);
                    continue;
                }
                // No lock file: create and take it, as a loader would.
                let lock = FileLock::acquire(&paths.lock, || {}).map_err(io_err(&paths.lock))?;
                self.gc_entry(&paths, lock, opts, now, &mut report)?;
                continue;
            };
            self.gc_entry(&paths, lock, opts, now, &mut report)?;
        }
        Ok(report)
    }

    fn gc_entry(
        &self,
        paths: &EntryPaths,
        lock: FileLock,
        opts: &GcOptions,
        now: u64,
        report: &mut GcReport,
    ) -> Result<(), CacheError> {
        let info = self.info(paths.stem.clone());
        let reason = if info.module_size.is_none() && !paths.manifest.exists() {
            Some("unused lock file".to_owned())
        } else {
            match check_entry(&info) {
                Err(why) => Some(format!("invalid: {why}")),
                Ok(m) => gc_policy(&m, opts, now),
            }
        };
        let Some(reason) = reason else {
            return Ok(());
        };
        // Manifest first: from that moment the entry is invalid to every reader, whatever else
        // happens; then the module; then the lock file, which only a holder may unlink.
        for path in [&paths.manifest, &paths.module] {
            match std::fs::remove_file(path) {
                Ok(()) => report.removed.push((path.clone(), reason.clone())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(path)(e)),
            }
        }
        lock.unlink().map_err(io_err(&paths.lock))?;
        report.removed.push((paths.lock.clone(), reason));
        Ok(())
    }

    /// Entry stems present in the directory; with `with_locks`, also stems that only have a lock.
    fn stems(&self, with_locks: bool) -> Result<BTreeSet<String>, CacheError> {
        let mut stems = BTreeSet::new();
        for item in std::fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let item = item.map_err(io_err(&self.dir))?;
            let name = item.file_name();
            let Some((stem, ext)) = name.to_str().and_then(parse_entry_file) else {
                continue;
            };
            if with_locks || ext != layout::LOCK_EXT {
                stems.insert(stem.to_owned());
            }
        }
        Ok(stems)
    }

    fn info(&self, stem: String) -> EntryInfo {
        let (entry, key) = layout::parse_stem(&stem).expect("stems() yields entry stems");
        let (entry, key) = (entry.to_owned(), key.to_owned());
        let paths = EntryPaths::for_stem(&self.dir, stem);
        let module_size = std::fs::metadata(&paths.module).ok().map(|m| m.len());
        let manifest = match std::fs::read(&paths.manifest) {
            Ok(b) => Manifest::parse(&b),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Invalid::NoManifest),
            Err(e) => Err(Invalid::ManifestUnreadable(e.to_string())),
        };
        EntryInfo {
            entry,
            key,
            module_path: paths.module,
            manifest_path: paths.manifest,
            module_size,
            manifest,
        }
    }
}

/// Full check of one listed entry, without a request to compare against.
fn check_entry(info: &EntryInfo) -> Result<Manifest, Invalid> {
    let m = info.manifest.clone()?;
    if m.key != info.key || m.identity.entry != info.entry {
        return Err(Invalid::OtherEntry);
    }
    let bytes = std::fs::read(&info.module_path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Invalid::NoModule,
        _ => Invalid::ModuleUnreadable(e.to_string()),
    })?;
    m.check_module(&bytes)?;
    Ok(m)
}

fn gc_policy(m: &Manifest, opts: &GcOptions, now: u64) -> Option<String> {
    if let Some(age) = opts.older_than {
        if now.saturating_sub(m.created_unix) > age.as_secs() {
            return Some(format!(
                "older than {:.1} days",
                age.as_secs_f64() / 86_400.0
            ));
        }
    }
    let c = &m.identity.compiler;
    if let Some(v) = &opts.keep_compiler_version {
        if &c.version != v {
            return Some(format!("compiler version {} (keeping {v})", c.version));
        }
    }
    if let Some(keep) = &opts.keep_compiler {
        if c != keep {
            return Some("built by another compiler identity".into());
        }
    }
    None
}

/// Reads manifest and module once and verifies them against `identity`.
fn probe(paths: &EntryPaths, identity: &Identity) -> Probe {
    let manifest = match std::fs::read(&paths.manifest) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Probe::Missing,
        Err(e) => return Probe::Invalid(Invalid::ManifestUnreadable(e.to_string())),
    };
    let manifest = match Manifest::parse(&manifest) {
        Ok(m) => m,
        Err(why) => return Probe::Invalid(why),
    };
    if let Some(field) = manifest.identity.first_difference(identity) {
        return Probe::Invalid(Invalid::DiffersFromRequest(field));
    }
    if manifest.key != identity.key() {
        return Probe::Invalid(Invalid::KeyDiffersFromRequest);
    }
    let bytes = match std::fs::read(&paths.module) {
        Ok(b) => b,
        Err(e) => return Probe::Invalid(Invalid::ModuleUnreadable(e.to_string())),
    };
    match manifest.check_module(&bytes) {
        Ok(()) => Probe::Valid(bytes, Box::new(manifest)),
        Err(why) => Probe::Invalid(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiler() -> CompilerIdentity {
        CompilerIdentity {
            library_sha256: "11".repeat(32),
            version: "test".into(),
            flags: vec![],
            target_cpu: "generic".into(),
        }
    }

    // The pure-file behaviour with a fake "compiler"; real compiles are in tests/iree_cache.rs.
    #[test]
    fn compiles_once_then_loads_and_rejects_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let req = ModuleRequest {
            entry: "e",
            config_identity: "c",
            mlir: "mlir text",
            weights: &[],
        };
        let events = std::sync::Arc::new(Mutex::new(Vec::new()));
        let seen = events.clone();
        let cache = ArtifactCache::open(dir.path())
            .unwrap()
            .with_progress(Progress::new(move |e| {
                seen.lock()
                    .unwrap()
                    .push((format!("{e:?}"), e.to_string(), e.is_warning()))
            }));
        let fake = |m: &str| Ok(format!("compiled({m})").into_bytes());
        let a = cache.load_or_compile(&req, &compiler(), fake).unwrap();
        assert!(a.compiled);
        {
            let events = events.lock().unwrap();
            assert_eq!(events.len(), 2, "{events:?}");
            assert!(
                events[0].0.starts_with("Compiling { entry: \"e\""),
                "{events:?}"
            );
            assert!(events[1].0.contains("ok: true"), "{events:?}");
            // The lines a server logs and a terminal shows.
            assert_eq!(events[0].1, "compiling e: not in the artifact cache");
            assert!(
                events[1].1.starts_with("compiled e in ") && events[1].1.ends_with(" s"),
                "{events:?}"
            );
            assert!(!events[0].2 && !events[1].2, "{events:?}");
        }
        let b = cache.load_or_compile(&req, &compiler(), fake).unwrap();
        assert!(!b.compiled);
        assert_eq!(a.bytes, b.bytes);
        assert_eq!(cache.compiles(), 1);

        let info = &cache.list().unwrap()[0];
        let mut module = std::fs::read(&info.module_path).unwrap();
        module[0] ^= 1;
        std::fs::write(&info.module_path, &module).unwrap();
        assert!(cache.verify().unwrap()[0].1.is_err());
        let c = cache.load_or_compile(&req, &compiler(), fake).unwrap();
        assert!(c.compiled);
        assert!(
            events
                .lock()
                .unwrap()
                .iter()
                .any(|(debug, line, warning)| debug.starts_with("Rebuilding")
                    && line.starts_with("artifact cache: rebuilding e: ")
                    && *warning),
            "a tampered entry is reported as rebuilt"
        );
        assert_eq!(c.bytes, a.bytes);
        assert!(cache.verify().unwrap()[0].1.is_ok());

        let err = cache
            .load_or_compile(&req, &compiler(), |_| Err("boom".into()))
            .map(|_| ());
        assert!(err.is_ok(), "valid entry: the compiler is not called");
        let bad = ModuleRequest {
            entry: "../x",
            ..req
        };
        assert!(matches!(
            cache.load_or_compile(&bad, &compiler(), fake),
            Err(CacheError::InvalidEntry(_))
        ));
    }

    #[test]
    fn failed_compile_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::open(dir.path()).unwrap();
        let req = ModuleRequest {
            entry: "e",
            config_identity: "c",
            mlir: "bad",
            weights: &[],
        };
        let err = cache.load_or_compile(&req, &compiler(), |_| Err("syntax error".into()));
        assert!(matches!(err, Err(CacheError::Compile { .. })));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".lock")), "{names:?}");
        let report = cache.gc(&GcOptions::default()).unwrap();
        assert_eq!(report.removed.len(), 1, "{report:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn default_dir_is_under_the_user_cache() {
        let d = ArtifactCache::default_dir();
        assert!(d.ends_with("switchyard/iree"));
        assert!(!d.starts_with(std::env::temp_dir()));
    }
}
