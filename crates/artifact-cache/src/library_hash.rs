//! sha256 of the compiler library, memoized in the cache directory.
//!
//! The library is ~336 MB; hashing it on every start would cost seconds. The memo is keyed by
//! everything that changes when the file is replaced or rewritten: canonical path, size, mtime,
//! ctime and inode (and device). ctime cannot be set from user space, so even a replacement that
//! restores size and mtime (`cp -p`, `touch -r`) misses the memo and is hashed again.

use super::identity::hex;
use super::layout::{publish, temp_file};
use super::lock::FileLock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The memo file (and, with `.lock`, its lock) in the cache dir.
pub(crate) const MEMO_STEM: &str = "compiler-library-sha256";
/// Keep the memo small: a few compiler installations at most are in use at once.
const MAX_RECORDS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stamp {
    path: PathBuf,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    inode: u64,
    device: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    stamp: Stamp,
    sha256: String,
}

fn stamp(path: &Path) -> io::Result<Stamp> {
    let path = path.canonicalize()?;
    let m = std::fs::metadata(&path)?;
    Ok(Stamp {
        path,
        len: m.len(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        inode: m.ino(),
        device: m.dev(),
    })
}

fn read_memo(memo: &Path) -> Vec<Record> {
    // A missing, unreadable or foreign memo only costs a re-hash.
    std::fs::read(memo)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn hash_file(path: &Path) -> io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// sha256 (hex) of `file`, from the memo in `cache_dir` when the file is unchanged.
pub(crate) fn file_sha256(cache_dir: &Path, file: &Path) -> io::Result<String> {
    let memo = cache_dir.join(format!("{MEMO_STEM}.json"));
    let before = stamp(file)?;
    let lookup = |records: &[Record]| {
        records
            .iter()
            .find(|r| r.stamp == before)
            .map(|r| r.sha256.clone())
    };
    if let Some(sha) = lookup(&read_memo(&memo)) {
        return Ok(sha);
    }
    // Serialise hashing across processes: a second starter waits and then reads the memo rather
    // than hashing 336 MB at the same time.
    let _lock = FileLock::acquire(&cache_dir.join(format!("{MEMO_STEM}.lock")), || {})?;
    let mut records = read_memo(&memo);
    if let Some(sha) = lookup(&records) {
        return Ok(sha);
    }
    let sha = hash_file(file)?;
    // Only memoize if the file did not change while it was read.
    if stamp(file)? == before {
        records.retain(|r| r.stamp.path != before.path);
        records.push(Record {
            stamp: before,
            sha256: sha.clone(),
        });
        let excess = records.len().saturating_sub(MAX_RECORDS);
        records.drain(..excess);
        let json = serde_json::to_vec_pretty(&records).expect("memo serialises");
        // Best effort: a read-only cache dir still works, it just hashes every time.
        if let Ok(tmp) = temp_file(cache_dir, MEMO_STEM) {
            let _ = publish(tmp, &json, &memo);
        }
    }
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::sha256_hex;

    #[test]
    fn memo_hits_until_the_file_is_replaced() {
        let cache = tempfile::tempdir().unwrap();
        let libdir = tempfile::tempdir().unwrap();
        let lib = libdir.path().join("libIREECompiler.so");
        std::fs::write(&lib, b"compiler one").unwrap();
        let first = file_sha256(cache.path(), &lib).unwrap();
        assert_eq!(first, sha256_hex(b"compiler one"));

        // A memo hit does not read the file: prove it by corrupting the memo's hash.
        let memo = cache.path().join(format!("{MEMO_STEM}.json"));
        let text = std::fs::read_to_string(&memo)
            .unwrap()
            .replace(&first, &"0".repeat(64));
        std::fs::write(&memo, text).unwrap();
        assert_eq!(file_sha256(cache.path(), &lib).unwrap(), "0".repeat(64));

        // Replaced by a file of the same size whose mtime is then restored (new inode, new
        // ctime): the memo misses and the new content is hashed.
        let old_mtime = std::fs::metadata(&lib).unwrap().modified().unwrap();
        let new = libdir.path().join("new.so");
        std::fs::write(&new, b"compiler two").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&new)
            .unwrap()
            .set_modified(old_mtime)
            .unwrap();
        std::fs::rename(&new, &lib).unwrap();
        assert_eq!(
            file_sha256(cache.path(), &lib).unwrap(),
            sha256_hex(b"compiler two")
        );
        // A garbage memo is ignored, not fatal.
        std::fs::write(&memo, b"not json").unwrap();
        assert_eq!(
            file_sha256(cache.path(), &lib).unwrap(),
            sha256_hex(b"compiler two")
        );
    }
}
