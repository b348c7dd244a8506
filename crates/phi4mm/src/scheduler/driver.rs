//! The driver thread: admits ready jobs into free slots, drops cancelled and expired rows, and
//! runs one batched decoder step per iteration over every occupied slot — prefill chunks of new
//! rows together with one decode token of each running row.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sampling::{first_non_finite, Logprobs};

use super::queue::panic_message;
use super::row::{Row, RowEnd};
use crate::step::{StepBackend, StepRow};

use super::job::{Detokenize, FinishReason, Outcome, Ready, RowError};
use super::state::{Shared, SlotView, State};

/// Longest sleep while idle; waiting jobs with deadlines are re-checked at least this often.
const IDLE_WAIT: Duration = Duration::from_millis(100);

fn cancelled<S>(row: &Row<S>) -> Outcome {
    Outcome::Finished {
        reason: FinishReason::Cancelled,
        prompt_tokens: row.prompt_tokens,
        completion_tokens: row.tokens.len(),
    }
}

pub(crate) fn run<B: StepBackend>(backend: Arc<B>, shared: Arc<Shared>, detok: Option<Detokenize>) {
    let n = shared.config.slots;
    let mut slots: Vec<Option<Row<B::State>>> = (0..n).map(|_| None).collect();
    loop {
        let turn = catch_unwind(AssertUnwindSafe(|| {
            iterate(&*backend, &shared, &mut slots, detok.as_ref())
        }));
        match turn {
            Ok(true) => {}
            Ok(false) => return,
            Err(payload) => {
                // A bug outside the decoder step: the rows in flight cannot be trusted, but the
                // thread must live on and every row must get its terminal event.
                let msg = format!("panic in the scheduler: {}", panic_message(&*payload));
                for mut row in slots.iter_mut().filter_map(Option::take) {
                    let m = msg.clone();
                    let _ = catch_unwind(AssertUnwindSafe(move || {
                        row.sink.done(Outcome::Failed(RowError::Internal(m)))
                    }));
                }
                publish(&mut shared.lock(), &slots);
            }
        }
    }
}

/// One turn of the driver; false once shut down.
fn iterate<B: StepBackend>(
    backend: &B,
    shared: &Shared,
    slots: &mut [Option<Row<B::State>>],
    detok: Option<&Detokenize>,
) -> bool {
    {
        // Under the lock: bookkeeping only; every sink call happens after it is released.
        let mut finished: Vec<(Row<B::State>, Outcome)> = Vec::new();
        let mut admitted: Vec<usize> = Vec::new();
        let mut expired_waiting: Vec<Ready> = Vec::new();
        {
            let mut st = shared.lock();
            loop {
                if st.shutdown {
                    let ready: Vec<Ready> = st.ready.drain(..).collect();
                    let waiting = std::mem::take(&mut st.waiting);
                    st.queued_tokens = 0;
                    st.slots.iter_mut().for_each(|s| *s = None);
                    drop(st);
                    drop(waiting);
                    for mut r in ready {
                        r.job.sink.done(Outcome::Finished {
                            reason: FinishReason::Cancelled,
                            prompt_tokens: 0,
                            completion_tokens: 0,
                        });
                    }
                    for mut row in slots.iter_mut().filter_map(Option::take) {
                        let o = cancelled(&row);
                        row.sink.done(o);
                    }
                    return false;
                }
                let now = Instant::now();
                for slot in slots.iter_mut() {
                    let drop_it = match slot {
                        Some(r) if st.cancel_running.remove(&r.id) => Some(None),
                        Some(r) if r.generation.deadline.is_some_and(|d| now >= d) => {
                            Some(Some(RowError::Deadline))
                        }
                        _ => None,
                    };
                    if let Some(err) = drop_it {
                        let row = slot.take().expect("occupied");
                        let o = match err {
                            None => cancelled(&row),
                            Some(e) => Outcome::Failed(e),
                        };
                        finished.push((row, o));
                    }
                }
                st.cancel_running.clear();
                // Expired jobs waiting for a slot leave the queue too.
                let mut i = 0;
                while i < st.ready.len() {
                    if st.ready[i]
                        .job
                        .generation
                        .deadline
                        .is_some_and(|d| now >= d)
                    {
                        let r = st.ready.remove(i).expect("index checked");
                        st.unqueue(r.job.id);
                        expired_waiting.push(r);
                    } else {
                        i += 1;
                    }
                }
                for (i, slot) in slots.iter_mut().enumerate() {
                    if slot.is_some() {
                        continue;
                    }
                    let Some(ready) = st.ready.pop_front() else {
                        break;
                    };
                    st.unqueue(ready.job.id);
                    *slot = Some(new_row(backend, ready));
                    admitted.push(i);
                }
                publish(&mut st, slots);
                let busy = slots.iter().any(Option::is_some);
                if busy || !finished.is_empty() || !expired_waiting.is_empty() {
                    break;
                }
                st = shared
                    .wake
                    .wait_timeout(st, IDLE_WAIT)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        for (mut row, outcome) in finished {
            row.sink.done(outcome);
        }
        for mut r in expired_waiting {
            r.job.sink.done(Outcome::Failed(RowError::Deadline));
        }
        let mut gone = false;
        for &i in &admitted {
            let row = slots[i].as_mut().expect("just admitted");
            if !row.sink.started(row.prompt_tokens) {
                slots[i] = None;
                gone = true;
            }
        }
        if gone {
            publish(&mut shared.lock(), slots);
        }
        if slots.iter().any(Option::is_some) {
            step(backend, shared, slots, detok);
        }
    }
    true
}

fn new_row<B: StepBackend>(backend: &B, ready: Ready) -> Row<B::State> {
    Row::new(ready.job, ready.prompt, backend.new_state())
}

fn publish<S>(st: &mut State, slots: &[Option<Row<S>>]) {
    for (p, s) in st.slots.iter_mut().zip(slots) {
        *p = s.as_ref().map(|r| SlotView {
            id: r.id,
            adapter: r.adapter,
            audio_branch: r.audio_branch,
            kv_positions: r.prefilled + r.tokens.len().saturating_sub(1),
        });
    }
}

/// How many of its `remaining` prompt tokens each row in prefill feeds this step, within
/// `budget` (at least 1) in all: a max-min fair share. The shortest prompts take what they need
/// first, and the longest take what is left, so a short request admitted beside a long prompt
/// starts at once instead of waiting for that prompt's whole prefill (a chat behind a prompt of
/// eight large images waited 79 s when the budget went to the rows in slot order), and no row
/// waits for the others while the budget holds a token for each. A share that does not end its
/// prompt is cut to a multiple of `granularity` (the backend's prefill call; what is cut goes to
/// the longer rows), unless that leaves it nothing. Some row always advances.
fn prefill_shares(remaining: &[usize], budget: usize, granularity: usize) -> Vec<usize> {
    let granularity = granularity.max(1);
    let mut order: Vec<usize> = (0..remaining.len()).collect();
    // Stable: between equal prompts, slot order.
    order.sort_by_key(|&k| remaining[k]);
    let mut shares = vec![0; remaining.len()];
    let mut left = budget;
    for (done, &k) in order.iter().enumerate() {
        let fair = left.div_ceil(order.len() - done);
        let mut take = remaining[k].min(fair);
        if take < remaining[k] && take >= granularity {
            take -= take % granularity;
        }
        shares[k] = take;
        left -= take;
    }
    shares
}

/// One batched decoder step over every occupied slot, then sampling and events per row.
fn step<B: StepBackend>(
    backend: &B,
    shared: &Shared,
    slots: &mut [Option<Row<B::State>>],
    detok: Option<&Detokenize>,
) {
    let hidden_of = |row: &Row<B::State>| row.prompt.len() / row.prompt_tokens.max(1);
    // Decode rows cost one token each; the prefill budget is shared fairly by the rows in
    // prefill (`prefill_shares`), and a row whose share is 0 this step waits for the next.
    let remaining: Vec<usize> = slots
        .iter()
        .flatten()
        .filter(|row| row.in_prefill())
        .map(|row| row.prompt_tokens - row.prefilled)
        .collect();
    let budget = shared.config.prefill_chunk.max(1);
    let granularity = backend.prefill_granularity();
    let mut shares = prefill_shares(&remaining, budget, granularity).into_iter();
    let mut plan: Vec<(usize, usize)> = Vec::new(); // (slot, prompt tokens this step; 0 = decode)
    for (i, slot) in slots.iter().enumerate() {
        let Some(row) = slot else { continue };
        if !row.in_prefill() {
            plan.push((i, 0));
            continue;
        }
        let take = shares.next().expect("a share per row in prefill");
        if take > 0 {
            plan.push((i, take));
        }
    }
    shared.count_step(plan.len());
    let outcome = {
        let mut batch: Vec<StepRow<'_, B::State>> = Vec::with_capacity(plan.len());
        let mut plan_iter = plan.iter().peekable();
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(&&(pi, take)) = plan_iter.peek() else {
                break;
            };
            if pi != i {
                continue;
            }
            plan_iter.next();
            let row = slot.as_mut().expect("planned slot is occupied");
            let h = hidden_of(row);
            let embeds: &[f32] = if take > 0 {
                &row.prompt[row.prefilled * h..(row.prefilled + take) * h]
            } else {
                &row.next_input
            };
            batch.push(StepRow {
                state: &mut row.state,
                embeds,
                adapter: row.adapter,
            });
        }
        catch_unwind(AssertUnwindSafe(|| backend.step(&mut batch)))
    };
    let logits = match outcome {
        Ok(l) => l,
        Err(payload) => {
            // The rows of a failed step have undefined caches: all of them fail.
            let msg = format!("panic in the decoder step: {}", panic_message(&*payload));
            let mut failed = Vec::new();
            for &(i, _) in &plan {
                failed.push(slots[i].take().expect("planned"));
            }
            publish(&mut shared.lock(), slots);
            for mut row in failed {
                row.sink
                    .done(Outcome::Failed(RowError::Internal(msg.clone())));
            }
            return;
        }
    };
    let mut finished = Vec::new();
    for (&(i, take), logits) in plan.iter().zip(logits) {
        let row = slots[i].as_mut().expect("planned");
        if take > 0 {
            row.prefilled += take;
            if row.in_prefill() {
                continue;
            }
            row.prompt = Vec::new();
            row.sink.first_logits(&logits);
        }
        if let Some((id, value)) = first_non_finite(&logits) {
            // Broken weights or config: this row fails, and so does a warm-up, which refuses
            // the instance at load.
            let row = slots[i].take().expect("planned");
            let message = format!(
                "the model's logits are not finite (token id {id}: {value}) at generated token \
                 {}: the checkpoint's weights or config are broken",
                row.tokens.len() + 1
            );
            finished.push((row, Outcome::Failed(RowError::Internal(message))));
            continue;
        }
        let token = row.sampler.sample(&logits);
        let logprobs = row
            .generation
            .logprobs
            .map(|k| Logprobs::of(&logits, token, k));
        let (text, stop) = row.push_token(token, detok);
        let alive = row.sink.token(token, &text, logprobs.as_ref());
        if !alive {
            slots[i] = None;
            continue;
        }
        let reason = match stop {
            RowEnd::Continue => {
                row.next_input = backend.embed(&[token]);
                continue;
            }
            RowEnd::Stop => FinishReason::Stop,
            RowEnd::Length => FinishReason::Length,
        };
        let row = slots[i].take().expect("planned");
        let outcome = Outcome::Finished {
            reason,
            prompt_tokens: row.prompt_tokens,
            completion_tokens: row.tokens.len(),
        };
        finished.push((row, outcome));
    }
    // The slot is free (in the stats too) before its client hears that the request finished;
    // every step publishes, so the KV positions in the stats follow the rows as they grow.
    publish(&mut shared.lock(), slots);
    for (mut row, outcome) in finished {
        row.sink.done(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::prefill_shares as shares_of;

    fn prefill_shares(remaining: &[usize], budget: usize) -> Vec<usize> {
        shares_of(remaining, budget, 1)
    }

    #[test]
    fn a_short_prompt_beside_a_long_one_is_prefilled_at_once() {
        // The long prompt first in slot order, as when it was admitted first.
        assert_eq!(prefill_shares(&[76_683, 7], 512), [505, 7]);
        assert_eq!(prefill_shares(&[7, 76_683], 512), [7, 505]);
    }

    #[test]
    fn long_prompts_share_the_budget_evenly_and_use_all_of_it() {
        assert_eq!(prefill_shares(&[1000, 1000, 1000], 512), [171, 171, 170]);
        assert_eq!(prefill_shares(&[1000, 100, 1000], 512), [206, 100, 206]);
        // Everything fits: each row gets what it needs.
        assert_eq!(prefill_shares(&[3, 5, 9], 512), [3, 5, 9]);
    }

    #[test]
    fn partial_shares_are_whole_prefill_calls() {
        // IREE's 64-position calls: nothing padded but a prompt's last call.
        assert_eq!(shares_of(&[1000, 1000, 1000], 512, 64), [128, 192, 192]);
        assert_eq!(shares_of(&[76_683, 7], 512, 64), [448, 7]);
        assert_eq!(shares_of(&[100, 30], 512, 64), [100, 30]);
        // A share smaller than one call is left as it is: the row still advances.
        assert_eq!(shares_of(&[1000, 1000], 40, 64), [20, 20]);
    }

    #[test]
    fn a_budget_smaller_than_the_rows_still_advances_the_shortest() {
        assert_eq!(prefill_shares(&[40, 30, 20, 10], 2), [0, 0, 1, 1]);
        assert_eq!(prefill_shares(&[40], 1), [1]);
        assert_eq!(prefill_shares(&[], 512), Vec::<usize>::new());
    }
}
