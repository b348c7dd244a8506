//! What the cache tells its owner while it works. The cache itself never prints: a library inside
//! a server must not draw on a terminal it does not own, so the owner (the plugin, the CLI)
//! decides how each event is shown.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::Invalid;

/// One thing a user waiting on the cache should know about.
#[derive(Debug, Clone, Copy)]
pub enum CacheEvent<'a> {
    /// Another thread or process holds the entry's lock (it is compiling); this call waits.
    Waiting { entry: &'a str },
    /// The published entry failed verification and is compiled again.
    Rebuilding { entry: &'a str, why: &'a Invalid },
    /// A compile of `entry` starts now.
    Compiling { entry: &'a str },
    /// The compile of `entry` ended (successfully or not) after `elapsed`.
    Compiled {
        entry: &'a str,
        elapsed: Duration,
        ok: bool,
    },
    /// The compiler gave up on a run of `entry` (`why`) and runs again: this is run `attempt`.
    /// Reported by the compiler, through [`ArtifactCache::progress`](crate::ArtifactCache::progress).
    Retrying {
        entry: &'a str,
        attempt: u32,
        why: &'a str,
    },
}

impl CacheEvent<'_> {
    /// Whether an operator should look: an entry failed verification, or a compile failed or had
    /// to run again.
    pub fn is_warning(&self) -> bool {
        matches!(
            self,
            CacheEvent::Rebuilding { .. }
                | CacheEvent::Compiled { ok: false, .. }
                | CacheEvent::Retrying { .. }
        )
    }
}

/// The one line each event reads as, on a terminal and in a server's log alike.
impl fmt::Display for CacheEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheEvent::Waiting { entry } => {
                write!(f, "waiting for another process compiling {entry}")
            }
            CacheEvent::Rebuilding { entry, why } => {
                write!(f, "artifact cache: rebuilding {entry}: {why}")
            }
            CacheEvent::Compiling { entry } => {
                write!(f, "compiling {entry}: not in the artifact cache")
            }
            CacheEvent::Compiled { entry, elapsed, ok } => {
                let secs = elapsed.as_secs_f64();
                if *ok {
                    write!(f, "compiled {entry} in {secs:.1} s")
                } else {
                    write!(f, "compiling {entry} failed after {secs:.1} s")
                }
            }
            CacheEvent::Retrying {
                entry,
                attempt,
                why,
            } => write!(f, "compiling {entry} again (run {attempt}): {why}"),
        }
    }
}

type Callback = dyn Fn(CacheEvent<'_>) + Send + Sync;

/// A cloneable callback receiving [`CacheEvent`]s; [`Progress::none`] drops them.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<Callback>>);

impl Progress {
    pub fn none() -> Self {
        Progress(None)
    }

    pub fn new(f: impl Fn(CacheEvent<'_>) + Send + Sync + 'static) -> Self {
        Progress(Some(Arc::new(f)))
    }

    pub fn report(&self, event: CacheEvent<'_>) {
        if let Some(f) = &self.0 {
            f(event)
        }
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Progress(callback)"
        } else {
            "Progress(none)"
        })
    }
}
