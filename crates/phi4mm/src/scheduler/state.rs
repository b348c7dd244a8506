//! The state the scheduler's threads share under one lock.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::adapter::{AdapterMode, AudioBranch};

use super::config::SchedulerConfig;
use super::job::{PrepareFn, Ready};

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

#[derive(Default)]
pub(crate) struct State {
    /// Admitted and not in a slot: id → prompt tokens charged.
    pub waiting: HashMap<u64, usize>,
    pub queued_tokens: usize,
    /// Prepare functions (and so the media bytes they own) of admitted jobs that no media worker
    /// has started yet: id → (admission number, prepare). Cancelling a waiting job removes its
    /// entry, which drops the media at once; a worker takes the entry only if the number still
    /// matches (an id cancelled and submitted again gets a new number).
    pub pending: HashMap<u64, (u64, PrepareFn)>,
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

    /// Forgets a waiting job's admission charge (and its unstarted prepare function); false if it
    /// was not waiting.
    pub fn unqueue(&mut self, id: u64) -> bool {
        self.unqueue_taking(id).0
    }

    /// [`unqueue`](Self::unqueue), handing back the job's unstarted prepare function so the
    /// caller drops it (and the media it owns) outside the lock.
    pub fn unqueue_taking(&mut self, id: u64) -> (bool, Option<PrepareFn>) {
        let pending = self.pending.remove(&id).map(|(_, p)| p);
        let found = match self.waiting.remove(&id) {
            Some(tokens) => {
                self.queued_tokens -= tokens;
                true
            }
            None => false,
        };
        (found, pending)
    }
}

pub(crate) struct Shared {
    pub state: Mutex<State>,
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
