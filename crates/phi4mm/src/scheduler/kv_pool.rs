//! The KV pool: a byte budget for every admitted row's KV cache. Admission reserves the most a
//! row can come to (its backend's [`kv_bytes`](crate::step::StepBackend::kv_bytes) of prompt +
//! `max_tokens` positions) and the reservation travels with the job's sink until its terminal
//! event, so every way a job ends (finished, failed, cancelled while waiting, preparing or
//! running, its client gone) gives the bytes back exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::job::{Outcome, Refusal, RowSink};
use crate::sampling::Logprobs;

/// How big the pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvBudget {
    /// No bound (tools and tests that run a fixed set of jobs).
    Unbounded,
    /// This many bytes.
    Bytes(usize),
    /// Room for one row of this many positions per slot, as the backend counts them.
    SlotsOf(usize),
}

/// Bytes a row of so many positions reserves, as its backend counts them.
pub(crate) type RowBytes = Arc<dyn Fn(usize) -> usize + Send + Sync>;

pub(crate) struct KvPool {
    total: usize,
    reserved: Arc<AtomicUsize>,
    row_bytes: RowBytes,
}

impl KvPool {
    pub fn new(budget: KvBudget, slots: usize, row_bytes: RowBytes) -> Self {
        let total = match budget {
            KvBudget::Unbounded => usize::MAX,
            KvBudget::Bytes(b) => b,
            KvBudget::SlotsOf(positions) => row_bytes(positions).saturating_mul(slots),
        };
        KvPool {
            total,
            reserved: Arc::new(AtomicUsize::new(0)),
            row_bytes,
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// The most positions one row can hold: the longest row whose reservation fits the whole
    /// pool, as its backend counts rows (the IREE backend's beyond its context never fit).
    pub fn largest_row(&self) -> usize {
        // Row sizes grow with positions: the last length that fits, by bisection.
        // 2^32 positions is beyond any context, and its byte count within a usize.
        let (mut fits, mut too_long) = (0usize, 1usize << 32);
        while too_long - fits > 1 {
            let mid = fits + (too_long - fits) / 2;
            if (self.row_bytes)(mid) <= self.total {
                fits = mid;
            } else {
                too_long = mid;
            }
        }
        fits
    }

    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Reserves what a row of `positions` positions needs: refused as invalid (HTTP 400) when
    /// it exceeds the whole pool, as overloaded (HTTP 429) when it only has to wait for rows to
    /// finish. Admissions reserve under the scheduler's lock, so a check and its reservation
    /// see no other admission in between; releases may happen at any time, which only frees
    /// more.
    pub fn reserve(&self, positions: usize) -> Result<KvReservation, Refusal> {
        let bytes = (self.row_bytes)(positions);
        if bytes > self.total {
            return Err(Refusal::Invalid(format!(
                "a row of {positions} positions (prompt + max_tokens) needs {} of KV cache, more \
                 than the whole pool (kv_cache_bytes = {})",
                mib(bytes),
                mib(self.total)
            )));
        }
        let reserved = self.reserved.load(Ordering::Acquire);
        if reserved + bytes > self.total {
            return Err(Refusal::Overloaded(format!(
                "a row of {positions} positions needs {} of KV cache; {} of the pool's {} \
                 (kv_cache_bytes) are reserved by running and waiting requests",
                mib(bytes),
                mib(reserved),
                mib(self.total)
            )));
        }
        self.reserved.fetch_add(bytes, Ordering::AcqRel);
        Ok(KvReservation {
            bytes,
            reserved: self.reserved.clone(),
        })
    }
}

/// Bytes as a refusal shows them: exact (a pool and a row that round to the same MiB read as
/// a contradiction), with the MiB for the eye.
fn mib(bytes: usize) -> String {
    if bytes == usize::MAX {
        "unbounded".into()
    } else {
        format!(
            "{bytes} bytes ({:.1} MiB)",
            bytes as f64 / (1024.0 * 1024.0)
        )
    }
}

/// Bytes reserved from the pool, given back when dropped.
pub(crate) struct KvReservation {
    bytes: usize,
    reserved: Arc<AtomicUsize>,
}

impl Drop for KvReservation {
    fn drop(&mut self) {
        self.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A job's sink holding its reservation: the terminal event gives the bytes back before the
/// client hears of it (so a client that retries at once finds them free), and dropping the
/// sink without one gives them back too.
pub(crate) struct ReservedSink {
    pub sink: Box<dyn RowSink>,
    pub kv: Option<KvReservation>,
}

impl RowSink for ReservedSink {
    fn started(&mut self, prompt_tokens: usize) -> bool {
        self.sink.started(prompt_tokens)
    }

    fn token(&mut self, id: u32, text: &str, logprobs: Option<&Logprobs>) -> bool {
        self.sink.token(id, text, logprobs)
    }

    fn first_logits(&mut self, logits: &[f32]) {
        self.sink.first_logits(logits)
    }

    fn done(&mut self, outcome: Outcome) {
        self.kv.take();
        self.sink.done(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(budget: KvBudget) -> KvPool {
        KvPool::new(budget, 4, Arc::new(|p| p * 10))
    }

    #[test]
    fn refuses_what_never_fits_as_invalid_and_what_must_wait_as_overloaded() {
        let p = pool(KvBudget::Bytes(1000));
        assert!(matches!(p.reserve(101), Err(Refusal::Invalid(m)) if m.contains("kv_cache_bytes")));
        let a = p.reserve(60).expect("fits");
        assert_eq!(p.reserved(), 600);
        assert!(
            matches!(p.reserve(50), Err(Refusal::Overloaded(m)) if m.contains("kv_cache_bytes"))
        );
        // A refusal reserves nothing.
        assert_eq!(p.reserved(), 600);
        drop(a);
        assert_eq!(p.reserved(), 0);
        let _b = p.reserve(50).expect("fits once the first row is gone");
    }

    #[test]
    fn the_largest_row_is_the_longest_that_the_pool_takes() {
        let p = pool(KvBudget::Bytes(1005));
        assert_eq!(p.largest_row(), 100);
        drop(p.reserve(100).expect("the largest row fits"));
        assert!(matches!(p.reserve(101), Err(Refusal::Invalid(_))));
        // A backend whose rows stop fitting past its context.
        let context = KvPool::new(
            KvBudget::Bytes(1 << 20),
            1,
            Arc::new(|p| if p > 64 { usize::MAX } else { p }),
        );
        assert_eq!(context.largest_row(), 64);
    }

    #[test]
    fn slots_of_sizes_the_pool_from_the_backend() {
        assert_eq!(pool(KvBudget::SlotsOf(100)).total(), 4000);
        assert_eq!(pool(KvBudget::Unbounded).total(), usize::MAX);
    }
}
