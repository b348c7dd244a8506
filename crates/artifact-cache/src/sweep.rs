//! Removing temp files whose writer is dead.
//!
//! A writer creates `.<stem>~<random>.tmp` only while holding `<stem>.lock`, and keeps holding it
//! until the temp file is renamed away (or deleted, if the write fails). The kernel drops the
//! lock when the writer dies. So a temp file is stale exactly when its stem's lock can be taken
//! (or the lock file is gone: holders keep it linked, see `lock.rs`) — no age threshold, no pid
//! files. A temp file of a live writer, in this or any other process, is never touched.

use super::layout::parse_temp;
use super::lock::FileLock;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Temp files in `dir`, grouped by stem.
fn temps_by_stem(dir: &Path) -> io::Result<BTreeMap<String, Vec<PathBuf>>> {
    let mut by_stem: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for item in std::fs::read_dir(dir)? {
        let item = item?;
        if let Some(stem) = item.file_name().to_str().and_then(parse_temp) {
            by_stem
                .entry(stem.to_owned())
                .or_default()
                .push(item.path());
        }
    }
    Ok(by_stem)
}

/// Removes every stale temp file in `dir`; returns the ones removed. Temps whose writer is
/// alive (the lock is held) are left alone.
pub(crate) fn sweep_stale(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for (stem, temps) in temps_by_stem(dir)? {
        let lock_path = dir.join(format!("{stem}.{}", super::layout::LOCK_EXT));
        let guard = match FileLock::try_acquire_existing(&lock_path)? {
            Some(guard) => Some(guard),
            // No lock file: the writer is gone (a live writer keeps its lock file linked).
            None if !lock_path.exists() => None,
            // Someone holds the lock: these may be their temps in progress.
            None => continue,
        };
        // While we hold the lock (or no lock file exists) no writer of this stem can be active,
        // so every temp listed above belongs to a finished or dead writer.
        removed.extend(remove_all(temps)?);
        drop(guard);
    }
    Ok(removed)
}

/// Removes the temp files of one stem. The caller must hold that stem's lock.
pub(crate) fn sweep_stem_locked(dir: &Path, stem: &str) -> io::Result<Vec<PathBuf>> {
    match temps_by_stem(dir)?.remove(stem) {
        Some(temps) => remove_all(temps),
        None => Ok(Vec::new()),
    }
}

fn remove_all(temps: Vec<PathBuf>) -> io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for t in temps {
        match std::fs::remove_file(&t) {
            Ok(()) => removed.push(t),
            // Renamed onto its final name by a writer that finished in the meantime.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::super::layout::temp_file;
    use super::*;

    #[test]
    fn sweeps_only_temps_without_a_live_writer() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Writer alive: lock held, temp present.
        let live_lock = FileLock::acquire(&d.join("live.lock"), || {}).unwrap();
        let live = temp_file(d, "live")
            .unwrap()
            .into_temp_path()
            .keep()
            .unwrap();
        // Writer dead: lock file present but free.
        drop(FileLock::acquire(&d.join("dead.lock"), || {}).unwrap());
        let dead = temp_file(d, "dead")
            .unwrap()
            .into_temp_path()
            .keep()
            .unwrap();
        // Writer dead and its lock file gone.
        let gone = temp_file(d, "gone")
            .unwrap()
            .into_temp_path()
            .keep()
            .unwrap();
        // Not a temp file of ours.
        std::fs::write(d.join("other.tmp"), b"x").unwrap();

        let mut removed = sweep_stale(d).unwrap();
        removed.sort();
        let mut expected = vec![dead, gone];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(live.exists());
        assert!(d.join("other.tmp").exists());
        assert_eq!(sweep_stem_locked(d, "live").unwrap(), vec![live.clone()]);
        drop(live_lock);
    }
}
