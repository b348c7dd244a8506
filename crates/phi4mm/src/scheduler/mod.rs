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

mod driver;
mod queue;
mod row;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::adapter::{AdapterMode, AudioBranch};
use crate::sampling::{Logprobs, SamplingConfig};
use crate::step::StepBackend;

/// Token ids → text (for streaming text and stop strings).
pub type Detokenize = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;

/// A prompt as a row takes it: the output of a job's prepare function.
pub struct RowPrompt {
    /// `[prompt_tokens, hidden]`.
    pub embeds: Vec<f32>,
    pub prompt_tokens: usize,
    pub adapter: AdapterMode,
    /// The audio-projection branch the clips were encoded with, when the request had audio.
    pub audio_branch: Option<AudioBranch>,
}

/// Why a row failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowError {
    /// The request is bad (found while preparing it).
    Invalid(String),
    /// A failure or a caught panic inside the model.
    Internal(String),
    /// The request's deadline passed.
    Deadline,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
}

/// The terminal event of an admitted job (exactly one per job, unless its sink went away).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    Failed(RowError),
}

/// Where a job's events go. Called from the scheduler's threads; keep it quick (a channel send).
pub trait RowSink: Send + 'static {
    /// The row got a slot. `false` = the client is gone: the row is dropped.
    fn started(&mut self, prompt_tokens: usize) -> bool;
    /// One sampled token and the text it adds, with its log probabilities when the job asked
    /// for them. `false` = the client is gone.
    fn token(&mut self, id: u32, text: &str, logprobs: Option<&Logprobs>) -> bool;
    /// Logits at the last prompt position (tests and tools; ignored by default).
    fn first_logits(&mut self, _logits: &[f32]) {}
    fn done(&mut self, outcome: Outcome);
}

/// Turns a job's raw input into decoder input; runs on the media pool.
pub type PrepareFn = Box<dyn FnOnce() -> Result<RowPrompt, RowError> + Send>;

pub struct Job {
    pub id: u64,
    /// Prompt tokens charged against the queue's token bound at admission (known before
    /// preparing; placeholders count once per medium until prepared).
    pub prompt_tokens: usize,
    pub prepare: PrepareFn,
    pub generation: GenerationParams,
    pub sink: Box<dyn RowSink>,
}

/// How a job generates and when it stops; it travels unchanged from admission to the slot.
#[derive(Clone, Debug)]
pub struct GenerationParams {
    pub sampling: SamplingConfig,
    /// Report log probabilities with every token: the sampled one's and this many best.
    pub logprobs: Option<usize>,
    pub max_new_tokens: usize,
    /// Ids that end the row (EOS and the like); the id itself is still reported.
    pub stop_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
    pub deadline: Option<Instant>,
}

impl GenerationParams {
    /// Greedy, `max_new_tokens` at most, no stops, no log probabilities, no deadline.
    pub fn greedy(max_new_tokens: usize) -> Self {
        GenerationParams {
            sampling: SamplingConfig::default(),
            logprobs: None,
            max_new_tokens,
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            deadline: None,
        }
    }
}

/// Why a job was not admitted (it then got no event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Queue full (requests or tokens): try later.
    Overloaded(String),
    /// Draining or shut down.
    Unavailable(String),
    /// The job itself is unacceptable.
    Invalid(String),
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Rows decoded together.
    pub slots: usize,
    /// Requests admitted beyond the free slots.
    pub max_queued: usize,
    /// Prompt tokens of all waiting requests together.
    pub max_queued_tokens: usize,
    /// Threads of the media pool (decoding, preprocessing, encoders).
    pub media_threads: usize,
    /// Prompt tokens prefilled per decoder step, over all new rows: bounds how long one step
    /// (and so every running row's next token) can be delayed by a long prompt.
    pub prefill_chunk: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            slots: 4,
            max_queued: 16,
            max_queued_tokens: 65_536,
            media_threads: 1,
            prefill_chunk: 512,
        }
    }
}

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

/// A prepared job waiting for a slot.
pub(crate) struct Ready {
    pub job: JobRest,
    pub prompt: RowPrompt,
}

/// A job without its prepare function.
pub(crate) struct JobRest {
    pub id: u64,
    pub prompt_tokens: usize,
    pub generation: GenerationParams,
    pub sink: Box<dyn RowSink>,
}

#[derive(Default)]
pub(crate) struct State {
    /// Admitted and not in a slot: id → prompt tokens charged.
    pub waiting: HashMap<u64, usize>,
    pub queued_tokens: usize,
    pub ready: VecDeque<Ready>,
    /// Slot occupancy as the driver last published it.
    pub slots: Vec<Option<(u64, AdapterMode, Option<AudioBranch>)>>,
    /// Running rows to drop at the next step boundary.
    pub cancel_running: HashSet<u64>,
    pub draining: bool,
    pub shutdown: bool,
}

impl State {
    fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Forgets a waiting job's admission charge; false if it was not waiting.
    pub fn unqueue(&mut self, id: u64) -> bool {
        match self.waiting.remove(&id) {
            Some(tokens) => {
                self.queued_tokens -= tokens;
                true
            }
            None => false,
        }
    }
}

pub(crate) struct Shared {
    pub state: Mutex<State>,
    pub wake: Condvar,
    pub config: SchedulerConfig,
    /// See [`SchedulerStats::steps_by_rows`]; counted by the driver without the lock.
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
        let shared = Arc::new(Shared {
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
        queue::admit(&self.shared, job.id, job.prompt_tokens)?;
        let Job {
            id,
            prompt_tokens,
            prepare,
            generation,
            sink,
        } = job;
        let rest = JobRest {
            id,
            prompt_tokens,
            generation,
            sink,
        };
        let shared = self.shared.clone();
        self.media
            .spawn(move || queue::prepare_and_enqueue(&shared, rest, prepare));
        Ok(())
    }

    /// Cancels a job wherever it is. Returns whether it was found.
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
        // Still preparing: its entry goes now; the media worker drops the job when it sees that.
        if st.unqueue(id) {
            return true;
        }
        if st.slots.iter().flatten().any(|(r, _, _)| *r == id) {
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
        for (_, a, b) in st.slots.iter().flatten() {
            rows_per_adapter[adapter_index(*a)] += 1;
            match b {
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
            slots: st.slots.iter().map(|s| s.map(|(id, _, _)| id)).collect(),
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
