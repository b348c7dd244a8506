//! Bounded admission and the media stage: a job is charged against the queue bounds at submit
//! (or refused without any change), prepared on the media pool, then handed to the driver.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::job::{FinishReason, JobRest, Outcome, PrepareFn, Ready, Refusal, RowError};
use super::kv_pool::KvReservation;
use super::state::{Admitted, Shared, State};

/// Charges a job against the bounds and reserves its KV cache (a row of `positions` positions),
/// and parks its prepare function until a media worker takes it, or refuses it leaving the state
/// untouched (the prepare function comes back). Returns the admission number the worker takes
/// the prepare function by, and the reservation.
pub(crate) fn admit(
    shared: &Shared,
    id: u64,
    prompt_tokens: usize,
    positions: usize,
    prepare: PrepareFn,
) -> Result<(u64, KvReservation), (Refusal, PrepareFn)> {
    let cfg = &shared.config;
    let mut st = shared.lock();
    match check(&st, cfg, id, prompt_tokens).and_then(|()| shared.kv.reserve(positions)) {
        Err(r) => {
            drop(st);
            Err((r, prepare))
        }
        Ok(kv) => {
            let admission = st.next_admission;
            st.next_admission += 1;
            st.waiting.insert(
                id,
                Admitted {
                    admission,
                    tokens: prompt_tokens,
                    prepare: Some(prepare),
                },
            );
            st.queued_tokens += prompt_tokens;
            Ok((admission, kv))
        }
    }
}

fn check(
    st: &State,
    cfg: &super::SchedulerConfig,
    id: u64,
    prompt_tokens: usize,
) -> Result<(), Refusal> {
    if st.draining {
        return Err(Refusal::Unavailable("the model is draining".into()));
    }
    if st.waiting.contains_key(&id) || st.slots.iter().flatten().any(|s| s.id == id) {
        return Err(Refusal::Invalid(format!(
            "request id {id} is already admitted"
        )));
    }
    // Waiting jobs beyond the slots that are free now are the queue.
    let free = st.slots.iter().filter(|s| s.is_none()).count();
    if st.waiting.len() >= free + cfg.max_queued {
        return Err(Refusal::Overloaded(format!(
            "{} requests waiting ({} free slots + queue bound {})",
            st.waiting.len(),
            free,
            cfg.max_queued
        )));
    }
    // An empty queue takes any prompt, so one long prompt is not refused forever.
    if !st.waiting.is_empty() && st.queued_tokens + prompt_tokens > cfg.max_queued_tokens {
        return Err(Refusal::Overloaded(format!(
            "{} prompt tokens waiting + {prompt_tokens} exceeds the bound {}",
            st.queued_tokens, cfg.max_queued_tokens
        )));
    }
    Ok(())
}

fn cancelled() -> Outcome {
    Outcome::Finished {
        reason: FinishReason::Cancelled,
        prompt_tokens: 0,
        completion_tokens: 0,
    }
}

/// Runs on the media pool: takes the job's parked prepare function (gone if the job was
/// cancelled meanwhile: cancelling drops it), prepares the job, then queues it for a slot.
/// Panics in the front end or the encoders become `Failed`. Every look at the queue after the
/// lock was released goes through the admission number: a job cancelled while it was being
/// prepared ends as cancelled, and never touches a job admitted since under the same id.
pub(crate) fn prepare_and_enqueue(shared: &Shared, mut job: JobRest, admission: u64) {
    let prepare = {
        let mut st = shared.lock();
        let prepare = if st.shutdown {
            None
        } else {
            st.admitted(job.id, admission)
                .and_then(|w| w.prepare.take())
        };
        match prepare {
            Some(prepare) => prepare,
            None => {
                drop(st);
                return job.sink.done(cancelled());
            }
        }
    };
    if job
        .generation
        .deadline
        .is_some_and(|d| std::time::Instant::now() >= d)
    {
        let mut st = shared.lock();
        if st.admitted(job.id, admission).is_some() {
            st.unqueue(job.id);
        }
        drop(st);
        drop(prepare);
        return job.sink.done(Outcome::Failed(RowError::Deadline));
    }
    let result = catch_unwind(AssertUnwindSafe(prepare)).unwrap_or_else(|payload| {
        Err(RowError::Internal(format!(
            "panic while preparing the request: {}",
            panic_message(&*payload)
        )))
    });
    let mut st = shared.lock();
    if st.shutdown || st.admitted(job.id, admission).is_none() {
        drop(st);
        return job.sink.done(cancelled());
    }
    match result {
        Ok(prompt) => {
            // Charge the real prompt length from now on.
            let entry = st.admitted(job.id, admission).expect("checked above");
            let charged = std::mem::replace(&mut entry.tokens, prompt.prompt_tokens);
            st.queued_tokens = st.queued_tokens - charged + prompt.prompt_tokens;
            job.prompt_tokens = prompt.prompt_tokens;
            st.ready.push_back(Ready { job, prompt });
            drop(st);
            shared.wake.notify_all();
        }
        Err(e) => {
            st.unqueue(job.id);
            drop(st);
            job.sink.done(Outcome::Failed(e));
        }
    }
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}
