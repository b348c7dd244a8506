//! The state the scheduler's threads share under one lock.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::adapter::{AdapterMode, AudioBranch};

use super::config::SchedulerConfig;
use super::job::{PrepareFn, Ready};
use super::kv_pool::KvPool;

/// What the stats see of an occupied slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotView {
    pub id: u64,
    pub adapter: AdapterMode,
    pub audio_branch: Option<AudioBranch>,
    /// Positions in the row's KV cache: the prompt tokens prefilled so far, then one per
    /// generated token already fed back (the token just sampled is not in the cache yet).
    pub kv_positions: usize,
}

/// One admitted job that has no slot yet.
pub(crate) struct Admitted {
    /// Unique per admission: a job cancelled and then submitted again under the same request id
    /// gets a new number, so the media worker still preparing the old one can tell that the
    /// entry is no longer its own and leaves it alone.
    pub admission: u64,
    /// Prompt tokens charged against the queue bound.
    pub tokens: usize,
    /// The prepare function (and so the media bytes it owns) until a media worker takes it:
    /// cancelling a job removes its entry, which drops its media at once.
    pub prepare: Option<PrepareFn>,
}

#[derive(Default)]
pub(crate) struct State {
    /// Admitted and not in a slot, by request id.
    pub waiting: HashMap<u64, Admitted>,
    pub queued_tokens: usize,
    /// The next admission number.
    pub next_admission: u64,
    pub ready: VecDeque<Ready>,
    /// Slot occupancy as the driver last published it.
    pub slots: Vec<Option<SlotView>>,
    /// Running rows to drop at the next step boundary.
    pub cancel_running: HashSet<u64>,
    pub draining: bool,
    pub shutdown: bool,
}

impl State {
    pub(super) fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// The waiting entry of admission `admission` of job `id`, if it is still there: `None` once
    /// the job was cancelled, even if the id has been admitted again since.
    pub fn admitted(&mut self, id: u64, admission: u64) -> Option<&mut Admitted> {
        self.waiting
            .get_mut(&id)
            .filter(|w| w.admission == admission)
    }

    /// Forgets a waiting job's admission charge (and its unstarted prepare function); false if it
    /// was not waiting.
    pub fn unqueue(&mut self, id: u64) -> bool {
        self.unqueue_taking(id).is_some()
    }

    /// [`unqueue`](Self::unqueue), handing back the job's entry so the caller drops its unstarted
    /// prepare function (and the media it owns) outside the lock.
    pub fn unqueue_taking(&mut self, id: u64) -> Option<Admitted> {
        let entry = self.waiting.remove(&id)?;
        self.queued_tokens -= entry.tokens;
        Some(entry)
    }
}

pub(crate) struct Shared {
    pub state: Mutex<State>,
    pub kv: KvPool,
    pub wake: Condvar,
    pub config: SchedulerConfig,
    /// See [`SchedulerStats::steps_by_rows`](super::SchedulerStats::steps_by_rows); counted by the
    /// driver without the lock.
    pub steps_by_rows: Vec<AtomicU64>,
}

impl Shared {
    pub fn count_step(&self, rows: usize) {
        if let Some(n) = rows.checked_sub(1).and_then(|i| self.steps_by_rows.get(i)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is caught by the driver; the state is still consistent
        // enough to cancel everything, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
