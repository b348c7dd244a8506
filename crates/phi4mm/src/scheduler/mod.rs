//! Continuous batching with per-row LoRA over a fixed number of slots.
//!
//! - [`Scheduler::submit`] admits a [`Job`] or refuses it at once ([`Refusal`]); a refused job
//!   changes nothing. Admission is bounded in requests and prompt tokens beyond the free slots.
//! - An admitted job is prepared (media decoding, encoders, placeholder merge — whatever its
//!   [`PrepareFn`] does) on a bounded media pool, then waits in FIFO order for a slot.
//! - One driver thread steps all slots together through a [`StepBackend`]: new rows are prefilled
//!   (in chunks) in the same decoder step as the decode tokens of running rows, each row with its
//!   own adapter, position and cache.
//! - Cancellation, client disconnect ([`RowSink`] returning `false`) and deadlines free the queue
//!   entry at once, or the slot at the next step boundary; every admitted row gets a fresh decoder
//!   state and sampler, so a reused slot starts clean.

mod config;
mod driver;
mod job;
mod kv_pool;
mod queue;
mod row;
mod state;

pub use config::SchedulerConfig;
pub use job::{
    Detokenize, FinishReason, GenerationParams, Job, Outcome, PrepareFn, Refusal, RowError,
    RowPrompt, RowSink,
};
pub use kv_pool::KvBudget;

use job::JobRest;
use kv_pool::{KvPool, ReservedSink};
use state::{Shared, State};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::adapter::{AdapterMode, AudioBranch};
use crate::step::StepBackend;

/// A snapshot of the scheduler.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub running: usize,
    /// Admitted, not in a slot (preparing or waiting).
    pub queued: usize,
    pub queued_tokens: usize,
    /// Of the queued: prepared and waiting for a slot.
    pub ready: usize,
    pub free_slots: usize,
    /// Running rows per adapter: `[none, speech, vision]`.
    pub rows_per_adapter: [usize; 3],
    /// Running rows with audio per audio-projection branch: `[speech, vision]`.
    pub rows_per_audio_branch: [usize; 2],
    /// Positions held in the running rows' KV caches, as of the last decoder step.
    pub kv_positions: usize,
    /// Bytes of the KV pool reserved by admitted rows (waiting and running).
    pub kv_reserved_bytes: usize,
    /// The KV pool's size in bytes (`usize::MAX`: unbounded).
    pub kv_pool_bytes: usize,
    /// Request id in each slot.
    pub slots: Vec<Option<u64>>,
    /// Decoder steps run since start, by how many rows they carried: element `n - 1` counts the
    /// steps of `n` rows (how full the batches are).
    pub steps_by_rows: Vec<u64>,
}

pub(crate) fn adapter_index(a: AdapterMode) -> usize {
    match a {
        AdapterMode::None => 0,
        AdapterMode::Speech => 1,
        AdapterMode::Vision => 2,
    }
}

pub struct Scheduler {
    shared: Arc<Shared>,
    media: rayon::ThreadPool,
    driver: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts the driver thread over `backend`.
    pub fn start<B: StepBackend>(
        backend: Arc<B>,
        config: SchedulerConfig,
        detok: Option<Detokenize>,
    ) -> std::io::Result<Self> {
        assert!(config.slots > 0, "at least one slot");
        let media = rayon::ThreadPoolBuilder::new()
            .num_threads(config.media_threads.max(1))
            .thread_name(|i| format!("phi4mm-media-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        let b = backend.clone();
        let kv = KvPool::new(
            config.kv_cache,
            config.slots,
            Arc::new(move |positions| b.kv_bytes(positions)),
        );
        let shared = Arc::new(Shared {
            kv,
            state: Mutex::new(State {
                slots: vec![None; config.slots],
                ..State::default()
            }),
            wake: Condvar::new(),
            steps_by_rows: (0..config.slots).map(|_| AtomicU64::new(0)).collect(),
            config,
        });
        let s = shared.clone();
        let driver = std::thread::Builder::new()
            .name("phi4mm-scheduler".into())
            .spawn(move || driver::run(backend, s, detok))?;
        Ok(Scheduler {
            shared,
            media,
            driver: Mutex::new(Some(driver)),
        })
    }

    pub fn submit(&self, job: Job) -> Result<(), Refusal> {
        if let Err(e) = job.generation.sampling.validate() {
            return Err(Refusal::Invalid(e.to_string()));
        }
        if job.generation.max_new_tokens == 0 {
            return Err(Refusal::Invalid("max_tokens must be at least 1".into()));
        }
        let Job {
            id,
            prompt_tokens,
            prepare,
            generation,
            sink,
        } = job;
        // A refused job's prepare function (and its media) is dropped here, outside the lock.
        let positions = prompt_tokens + generation.max_new_tokens;
        let (admission, kv) = queue::admit(&self.shared, id, prompt_tokens, positions, prepare)
            .map_err(|(r, _)| r)?;
        let rest = JobRest {
            id,
            prompt_tokens,
            generation,
            sink: Box::new(ReservedSink { sink, kv: Some(kv) }),
        };
        let shared = self.shared.clone();
        self.media
            .spawn(move || queue::prepare_and_enqueue(&shared, rest, admission));
        Ok(())
    }

    /// Cancels a job wherever it is. Returns whether it was found.
    /// The most positions (prompt and new tokens) one row can ever hold: what the KV pool
    /// takes, and the backend's context.
    pub fn largest_row(&self) -> usize {
        self.shared.kv.largest_row()
    }

    pub fn cancel(&self, id: u64) -> bool {
        let mut st = self.shared.lock();
        if let Some(pos) = st.ready.iter().position(|r| r.job.id == id) {
            let mut ready = st.ready.remove(pos).expect("position found");
            st.unqueue(id);
            drop(st);
            ready.job.sink.done(Outcome::Finished {
                reason: FinishReason::Cancelled,
                prompt_tokens: 0,
                completion_tokens: 0,
            });
            return true;
        }
        // Not prepared yet: its entry goes now, with its prepare function if no media worker
        // has started it (the media bytes are freed here, not when a worker reaches the job); the
        // worker then finishes the job as cancelled.
        if let Some(entry) = st.unqueue_taking(id) {
            drop(st);
            drop(entry);
            return true;
        }
        if st.slots.iter().flatten().any(|s| s.id == id) {
            st.cancel_running.insert(id);
            self.shared.wake.notify_all();
            return true;
        }
        false
    }

    pub fn stats(&self) -> SchedulerStats {
        let st = self.shared.lock();
        let mut rows_per_adapter = [0; 3];
        let mut rows_per_audio_branch = [0; 2];
        let mut kv_positions = 0;
        for slot in st.slots.iter().flatten() {
            rows_per_adapter[adapter_index(slot.adapter)] += 1;
            kv_positions += slot.kv_positions;
            match slot.audio_branch {
                Some(AudioBranch::Speech) => rows_per_audio_branch[0] += 1,
                Some(AudioBranch::Vision) => rows_per_audio_branch[1] += 1,
                None => {}
            }
        }
        let running = st.running();
        SchedulerStats {
            running,
            queued: st.waiting.len(),
            queued_tokens: st.queued_tokens,
            ready: st.ready.len(),
            free_slots: st.slots.len() - running,
            rows_per_adapter,
            rows_per_audio_branch,
            kv_positions,
            kv_reserved_bytes: self.shared.kv.reserved(),
            kv_pool_bytes: self.shared.kv.total(),
            slots: st.slots.iter().map(|s| s.map(|s| s.id)).collect(),
            steps_by_rows: self
                .shared
                .steps_by_rows
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .collect(),
        }
    }

    /// Stops admitting; admitted jobs run to completion.
    pub fn drain(&self) {
        self.shared.lock().draining = true;
    }

    /// Cancels everything and stops the driver thread.
    pub fn shutdown(&self) {
        {
            let mut st = self.shared.lock();
            st.draining = true;
            st.shutdown = true;
        }
        self.shared.wake.notify_all();
        let handle = self.driver.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shutdown();
    }
}
