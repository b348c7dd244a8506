//! A job and what it carries through the scheduler: its prompt, generation parameters, event
//! sink, terminal outcome and the reasons it can fail or be refused.

use std::sync::Arc;
use std::time::Instant;

use crate::adapter::{AdapterMode, AudioBranch};
use crate::sampling::{Logprobs, SamplingConfig};

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
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// The request is bad (found while preparing it).
    #[error("{0}")]
    Invalid(String),
    /// A failure or a caught panic inside the model.
    #[error("{0}")]
    Internal(String),
    /// The request's deadline passed.
    #[error("deadline exceeded")]
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
    /// Prompt tokens charged against the queue's token bound at admission, known before
    /// preparing (the plugin counts each medium at its token count read from its header); the
    /// prepared length replaces it once the job is prepared.
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
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Queue full (requests or tokens): try later.
    #[error("{0}")]
    Overloaded(String),
    /// Draining or shut down.
    #[error("{0}")]
    Unavailable(String),
    /// The job itself is unacceptable.
    #[error("{0}")]
    Invalid(String),
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
