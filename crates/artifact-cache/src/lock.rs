//! Per-entry advisory locks (flock via `std::fs::File::lock`).
//!
//! flock is released by the kernel when the owning process dies, however it dies, so a waiter
//! blocks exactly as long as the owner lives and takes over the moment it is gone: no pid files,
//! no heartbeats, no timeouts. flock is per open file description, so two threads of one process
//! that each open the lock file exclude each other just like two processes do.
//!
//! Lock files may be deleted (by `gc`), but only by a holder of the lock. A locker therefore
//! re-checks after acquiring that the path still names the inode it locked; if not, it locked a
//! file someone unlinked meanwhile and retries on the new one. Without this check, one process
//! could hold a lock on a deleted inode while another locks a fresh file at the same path.

// `File::lock`/`try_lock`/`unlock` (flock on Linux) are std since Rust 1.89, the workspace's
// rust-version.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub(crate) struct FileLock {
    // Held for its lock: closing the descriptor releases it.
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// Blocks until the lock is ours, creating the lock file if needed. `on_wait` runs once if
    /// someone else holds it (to tell the user why nothing happens).
    pub(crate) fn acquire(path: &Path, mut on_wait: impl FnMut()) -> io::Result<FileLock> {
        let mut told = false;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    if !told {
                        told = true;
                        on_wait();
                    }
                    file.lock()?;
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
            if still_linked(&file, path)? {
                return Ok(FileLock {
                    file,
                    path: path.to_owned(),
                });
            }
        }
    }

    /// Takes the lock if it is free. `Ok(None)` when someone holds it, or when the lock file does
    /// not exist (nobody can be holding it then: holders keep it linked).
    pub(crate) fn try_acquire_existing(path: &Path) -> io::Result<Option<FileLock>> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(e),
        }
        Ok(still_linked(&file, path)?.then(|| FileLock {
            file,
            path: path.to_owned(),
        }))
    }

    /// Deletes the lock file while still holding it (see the module comment for why that is the
    /// only safe moment), then releases.
    pub(crate) fn unlink(self) -> io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
        // `self.file` drops here, after the unlink.
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock; unlocking explicitly first makes the release
        // independent of any descriptor a child process might have inherited.
        let _ = self.file.unlock();
    }
}

fn still_linked(file: &File, path: &Path) -> io::Result<bool> {
    let held = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(now) => Ok(now.ino() == held.ino() && now.dev() == held.dev()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_open_file_description_is_excluded_then_takes_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let held = FileLock::acquire(&path, || panic!("free lock must not wait")).unwrap();
        assert!(FileLock::try_acquire_existing(&path).unwrap().is_none());
        let waiter = {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut waited = false;
                let _l = FileLock::acquire(&path, || waited = true).unwrap();
                waited
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "waiter blocks while the owner lives");
        drop(held);
        assert!(waiter.join().unwrap());
        assert!(FileLock::try_acquire_existing(&path).unwrap().is_some());
    }

    #[test]
    fn unlinked_lock_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        assert!(FileLock::try_acquire_existing(&path).unwrap().is_none());
        let held = FileLock::acquire(&path, || {}).unwrap();
        // A waiter that opened the old inode before the unlink must not end up holding it while
        // someone else locks a new file at the same path.
        let waiter = {
            let path = path.clone();
            std::thread::spawn(move || FileLock::acquire(&path, || {}).unwrap())
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        held.unlink().unwrap();
        let got = waiter.join().unwrap();
        assert!(
            path.exists(),
            "the waiter re-created and locked the live path"
        );
        assert!(FileLock::try_acquire_existing(&path).unwrap().is_none());
        drop(got);
    }
}
