//! File names in the cache directory, and crash-safe publication of a file.
//!
//! For an entry `audio.main` with key `<hex>` (64 hex digits) the stem is `audio.main-<hex>`:
//! - `<stem>.vmfb`  the module bytes;
//! - `<stem>.json`  its manifest, written last: a module without a valid manifest is never used;
//! - `<stem>.lock`  the lock held while compiling or removing the entry;
//! - `.<stem>~<random>.tmp`  a file being written; renamed onto its final name when complete.
//!
//! Anything else in the directory is not ours to interpret (the compiler-hash memo, say).

use super::identity::{is_key, valid_entry_name};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use tempfile::NamedTempFile;

pub(crate) const MODULE_EXT: &str = "vmfb";
pub(crate) const MANIFEST_EXT: &str = "json";
pub(crate) const LOCK_EXT: &str = "lock";

#[derive(Debug, Clone)]
pub(crate) struct EntryPaths {
    pub stem: String,
    pub module: PathBuf,
    pub manifest: PathBuf,
    pub lock: PathBuf,
}

impl EntryPaths {
    pub(crate) fn new(dir: &Path, entry: &str, key: &str) -> Self {
        Self::for_stem(dir, format!("{entry}-{key}"))
    }

    pub(crate) fn for_stem(dir: &Path, stem: String) -> Self {
        EntryPaths {
            module: dir.join(format!("{stem}.{MODULE_EXT}")),
            manifest: dir.join(format!("{stem}.{MANIFEST_EXT}")),
            lock: dir.join(format!("{stem}.{LOCK_EXT}")),
            stem,
        }
    }
}

/// `audio.main-<hex>` → (`audio.main`, `<hex>`), if it is an entry stem at all.
pub(crate) fn parse_stem(stem: &str) -> Option<(&str, &str)> {
    let (entry, key) = stem.rsplit_once('-')?;
    (valid_entry_name(entry) && is_key(key)).then_some((entry, key))
}

/// A file name of an entry file: (stem, extension).
pub(crate) fn parse_entry_file(name: &str) -> Option<(&str, &str)> {
    let (stem, ext) = name.rsplit_once('.')?;
    (matches!(ext, MODULE_EXT | MANIFEST_EXT | LOCK_EXT) && parse_stem(stem).is_some())
        .then_some((stem, ext))
}

/// A temp file name → the stem whose lock its writer held.
pub(crate) fn parse_temp(name: &str) -> Option<&str> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (stem, _random) = rest.split_once('~')?;
    (!stem.is_empty()).then_some(stem)
}

/// Creates `.<stem>~<random>.tmp` in `dir`. Callers hold `<stem>.lock` from before this call
/// until the file is renamed or removed; the sweep relies on that.
pub(crate) fn temp_file(dir: &Path, stem: &str) -> io::Result<NamedTempFile> {
    tempfile::Builder::new()
        .prefix(&format!(".{stem}~"))
        .suffix(".tmp")
        .rand_bytes(8)
        .tempfile_in(dir)
}

/// Writes the rest of `tmp`, makes it durable, renames it onto `dest` and makes the rename
/// durable: after a crash `dest` is either absent, the old file, or the complete new one.
pub(crate) fn publish(mut tmp: NamedTempFile, bytes: &[u8], dest: &Path) -> io::Result<()> {
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dest).map_err(|e| e.error)?;
    sync_dir(dest.parent().unwrap_or(Path::new(".")))
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        let key = "0123456789abcdef".repeat(4);
        let dir = Path::new("/c");
        let p = EntryPaths::new(dir, "audio.main", &key);
        assert_eq!(p.stem, format!("audio.main-{key}"));
        assert_eq!(parse_stem(&p.stem), Some(("audio.main", key.as_str())));
        let module = p.module.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_entry_file(module), Some((p.stem.as_str(), "vmfb")));
        assert_eq!(parse_entry_file("compiler-library-sha256.json"), None);
        assert_eq!(parse_entry_file(&format!("a-{}.json", &key[1..])), None);
        assert_eq!(
            parse_temp(&format!(".{}~abcd1234.tmp", p.stem)),
            Some(&*p.stem)
        );
        assert_eq!(parse_temp("x.tmp"), None);
        let tmp = temp_file(&std::env::temp_dir(), &p.stem).unwrap();
        let name = tmp.path().file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_temp(name), Some(&*p.stem));
    }

    #[test]
    fn publish_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        publish(temp_file(dir.path(), "f").unwrap(), b"one", &dest).unwrap();
        publish(temp_file(dir.path(), "f").unwrap(), b"two", &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
