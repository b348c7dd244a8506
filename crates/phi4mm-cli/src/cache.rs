//! `phi4mm cache ls|verify|gc|warm`: inspect, clean and fill the IREE artifact cache.

use anyhow::bail;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use switchyard_artifact_cache::{ArtifactCache, GcOptions};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: CacheCommand,
}

#[derive(clap::Args)]
struct DirArg {
    /// Cache directory (default: $XDG_CACHE_HOME/switchyard/iree, else ~/.cache/switchyard/iree).
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum CacheCommand {
    /// List entries: entry, key, module size, compiler version, creation time.
    Ls(DirArg),
    /// Check every entry (strict manifest, module sha256); exits nonzero if any is invalid.
    Verify(DirArg),
    /// Remove invalid entries, modules without manifest, unused locks and stale temp files.
    Gc {
        #[command(flatten)]
        dir: DirArg,
        /// Also remove valid entries published more than this many days ago.
        #[arg(long)]
        older_than_days: Option<f64>,
        /// Also remove valid entries built by any other compiler version.
        #[arg(long)]
        keep_compiler_version: Option<String>,
    },
    /// Compile every IREE module the plugin would load for a checkpoint and these settings into
    /// the cache, without running any: `--iree-device cuda` needs no GPU here, and a serving
    /// process then loads every module warm. Prints one JSON line: each module, and whether it
    /// was compiled now or already cached. (A build without the `iree` feature says so.)
    Warm {
        /// Checkpoint directory (either layout).
        #[arg(long)]
        model: PathBuf,
        #[command(flatten)]
        iree: crate::generate::IreeArgs,
    },
}

/// `gc` opens for writing (which also sweeps stale temp files); `ls` and `verify` only look.
fn open(dir: DirArg, write: bool) -> anyhow::Result<ArtifactCache> {
    let dir = dir.dir.unwrap_or_else(ArtifactCache::default_dir);
    if !dir.is_dir() {
        bail!("no cache directory at {}", dir.display());
    }
    Ok(if write {
        ArtifactCache::open(dir)?
    } else {
        ArtifactCache::inspect(dir)?
    })
}

fn short(key: &str) -> &str {
    &key[..16.min(key.len())]
}

fn age(created_unix: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let s = now.saturating_sub(created_unix);
    match s {
        0..120 => format!("{s} s ago"),
        120..7200 => format!("{} min ago", s / 60),
        7200..172_800 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

/// Rows as columns as wide as their widest cell (entry names and compiler versions vary in
/// length); the byte counts aligned right, the last column left ragged.
fn print_columns(rows: &[[String; 5]]) {
    let mut widths = [0; 5];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for [entry, key, bytes, compiler, created] in rows {
        let [we, wk, wb, wc, _] = widths;
        println!("{entry:<we$}  {key:<wk$}  {bytes:>wb$}  {compiler:<wc$}  {created}");
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        CacheCommand::Ls(dir) => {
            let cache = open(dir, false)?;
            let entries = cache.list()?;
            let mut rows = vec![["ENTRY", "KEY", "BYTES", "COMPILER", "CREATED"].map(String::from)];
            for e in &entries {
                let size = e
                    .module_size
                    .map_or_else(|| "-".to_owned(), |s| s.to_string());
                let (version, created) = match &e.manifest {
                    Ok(m) => (m.identity.compiler.version.clone(), age(m.created_unix)),
                    Err(why) => ("?".to_owned(), format!("({why})")),
                };
                rows.push([
                    e.entry.clone(),
                    short(&e.key).to_owned(),
                    size,
                    version,
                    created,
                ]);
            }
            print_columns(&rows);
            println!("{} entries in {}", entries.len(), cache.dir().display());
            Ok(())
        }
        CacheCommand::Verify(dir) => {
            let cache = open(dir, false)?;
            let results = cache.verify()?;
            let mut bad = 0;
            for (e, r) in &results {
                match r {
                    Ok(()) => println!("ok       {}-{}", e.entry, e.key),
                    Err(why) => {
                        bad += 1;
                        println!("INVALID  {}-{}: {why}", e.entry, e.key);
                    }
                }
            }
            println!("{} entries, {bad} invalid", results.len());
            if bad > 0 {
                bail!("{bad} invalid entries (run `phi4mm cache gc` to remove them)");
            }
            Ok(())
        }
        CacheCommand::Gc {
            dir,
            older_than_days,
            keep_compiler_version,
        } => {
            let cache = open(dir, true)?;
            let older_than = match older_than_days {
                Some(d) if !(d >= 0.0 && d.is_finite()) => {
                    bail!("--older-than-days must be a non-negative number")
                }
                Some(d) => Some(Duration::from_secs_f64(d * 86_400.0)),
                None => None,
            };
            let report = cache.gc(&GcOptions {
                older_than,
                keep_compiler_version,
                keep_compiler: None,
            })?;
            for (path, why) in &report.removed {
                println!("removed  {}: {why}", path.display());
            }
            for stem in &report.busy {
                println!("busy     {stem} (in use, left alone)");
            }
            println!("{} files removed", report.removed.len());
            Ok(())
        }
        CacheCommand::Warm { model, iree } => warm(&model, &iree),
    }
}

#[cfg(not(feature = "iree"))]
fn warm(_: &std::path::Path, _: &crate::generate::IreeArgs) -> anyhow::Result<()> {
    bail!(
        "this build of phi4mm has no IREE backend, so nothing to warm (build with --features iree)"
    )
}

#[cfg(feature = "iree")]
fn warm(model: &std::path::Path, iree: &crate::generate::IreeArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let ck = switchyard_phi4mm::checkpoint::Checkpoint::open(model)
        .with_context(|| format!("loading {}", model.display()))?;
    let settings = iree.settings();
    let modules = switchyard_phi4mm::iree::backend::warm_cache(
        &ck,
        &settings,
        crate::compile_progress::terminal(),
    )?;
    let dir = settings
        .cache_dir
        .clone()
        .unwrap_or_else(ArtifactCache::default_dir);
    println!(
        "{}",
        serde_json::json!({
            "cache_dir": dir,
            "device": settings.device,
            "target": settings.compile_target().to_string(),
            "modules": modules,
        })
    );
    Ok(())
}
