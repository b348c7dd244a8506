//! [`SchedulerConfig`]: slot count, admission bounds, KV pool, media pool and prefill chunk.

use super::kv_pool::KvBudget;

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
    /// Bytes of KV cache all admitted rows together may reserve.
    pub kv_cache: KvBudget,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            slots: 4,
            max_queued: 16,
            max_queued_tokens: 65_536,
            media_threads: 1,
            prefill_chunk: 512,
            kv_cache: KvBudget::Unbounded,
        }
    }
}
