//! Eight heterogeneous requests over four slots: staggered arrivals, one cancelled mid-decode
//! whose slot is reused by an audio request, one refused by the queue bound. Every survivor
//! equals its solo run; the cancelled and the refused requests leave no trace.
//!
//! Determinism comes from the sinks: a sink that pauses on a token blocks the scheduler thread
//! inside the batch, so the test can look at (and change) the scheduler at a known point.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::scheduler_support::*;
use switchyard_phi4mm::model::HostBackend;
use switchyard_phi4mm::scheduler::{
    FinishReason, GenerationParams, Job, KvBudget, Outcome, Refusal, RowError, Scheduler,
    SchedulerConfig, SchedulerStats,
};
use switchyard_phi4mm::step::StepBackend;

struct Harness {
    sched: Scheduler,
    backend: Arc<HostBackend>,
    tx: Sender<Ev>,
    rx: Receiver<Ev>,
    records: HashMap<u64, Record>,
}

impl Harness {
    fn new(slots: usize, max_queued: usize) -> Self {
        Self::with_kv(slots, max_queued, KvBudget::Unbounded)
    }

    fn with_kv(slots: usize, max_queued: usize, kv_cache: KvBudget) -> Self {
        Self::with_config(SchedulerConfig {
            slots,
            max_queued,
            kv_cache,
            ..SchedulerConfig::default()
        })
    }

    fn with_config(config: SchedulerConfig) -> Self {
        let backend = Arc::new(HostBackend(model()));
        let sched = Scheduler::start(
            backend.clone(),
            SchedulerConfig {
                // One media thread: requests are prepared, and so take slots, in arrival order.
                media_threads: 1,
                ..config
            },
            None,
        )
        .unwrap();
        let (tx, rx) = new_channel();
        Harness {
            sched,
            backend,
            tx,
            rx,
            records: HashMap::new(),
        }
    }

    fn sink(&self, id: u64) -> ChannelSink {
        ChannelSink::new(id, self.tx.clone())
    }

    fn submit(&self, id: u64, case: &str, max: usize, sink: ChannelSink) -> Result<(), Refusal> {
        self.sched
            .submit(job(&self.backend, id, pinned_case_input(case), max, sink))
    }

    /// Records events until `until` matches one.
    fn wait(&mut self, what: &str, until: impl Fn(&Ev) -> bool) {
        loop {
            let ev = self
                .rx
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
            let hit = until(&ev);
            apply(&mut self.records, ev);
            if hit {
                return;
            }
        }
    }

    /// Records the events already sent.
    fn drain(&mut self) {
        while let Ok(ev) = self.rx.try_recv() {
            apply(&mut self.records, ev);
        }
    }

    fn wait_stats(&self, what: &str, pred: impl Fn(&SchedulerStats) -> bool) -> SchedulerStats {
        let t0 = Instant::now();
        loop {
            let s = self.sched.stats();
            if pred(&s) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "timed out: {what}; stats {s:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn gate() -> (Sender<()>, Receiver<()>) {
    channel()
}

fn assert_idle(s: &SchedulerStats, slots: usize) {
    assert_eq!(
        s,
        &SchedulerStats {
            running: 0,
            queued: 0,
            queued_tokens: 0,
            ready: 0,
            free_slots: slots,
            rows_per_adapter: [0, 0, 0],
            rows_per_audio_branch: [0, 0],
            kv_positions: 0,
            // Every way a job ended gave its KV reservation back.
            kv_reserved_bytes: 0,
            kv_pool_bytes: s.kv_pool_bytes,
            slots: vec![None; slots],
            // The step counts only grow; what an idle scheduler must not hold is any row.
            steps_by_rows: s.steps_by_rows.clone(),
        }
    );
}

#[test]
fn eight_requests_over_four_slots() {
    let mut h = Harness::new(4, 2);
    const A: u64 = 1; // text, long
    const B: u64 = 2; // image, cancelled mid-decode
    const C: u64 = 3; // audio
    const D: u64 = 4; // image + audio
    const E: u64 = 5; // audio: reuses B's slot
    const F: u64 = 6; // text (speech LoRA)
    const G: u64 = 7; // refused by the queue bound
    const H: u64 = 8; // image, arrives late
    let plan: [(u64, &str, usize); 7] = [
        (A, "text_base", 48),
        (B, "image_vision", 40),
        (C, "audio_speech", 40),
        (D, "image_audio_vision", 16),
        (E, "chat_audio_text", 12),
        (F, "text_speech", 12),
        (H, "chat_image_text", 10),
    ];
    let max = |id: u64| plan.iter().find(|p| p.0 == id).unwrap().2;
    let case = |id: u64| plan.iter().find(|p| p.0 == id).unwrap().1;

    // A alone; the scheduler pauses inside A's second token.
    let (a_go, a_gate) = gate();
    let mut sa = h.sink(A);
    sa.pause_at = Some((2, a_gate));
    h.submit(A, case(A), max(A), sa).unwrap();
    h.wait("A token 1", |e| matches!(e, Ev::Token(A, _)));
    h.wait("A token 2", |e| matches!(e, Ev::Token(A, _)));

    // Staggered arrivals while A's batch is frozen: three free slots + a queue of two.
    h.submit(B, case(B), max(B), h.sink(B)).unwrap();
    h.submit(C, case(C), max(C), h.sink(C)).unwrap();
    let (d_go, d_gate) = gate();
    let mut sd = h.sink(D);
    sd.pause_at = Some((1, d_gate));
    h.submit(D, case(D), max(D), sd).unwrap();
    let (e_go, e_gate) = gate();
    let mut se = h.sink(E);
    se.pause_at = Some((1, e_gate));
    h.submit(E, case(E), max(E), se).unwrap();
    h.submit(F, case(F), max(F), h.sink(F)).unwrap();
    // Wait until the media stage is done with all five, so the stats below are stable.
    let before = h.wait_stats("B..F prepared", |s| s.ready == 5);
    assert_eq!(
        (before.running, before.queued, before.free_slots),
        (1, 5, 3)
    );

    // The queue is full: G is refused and nothing changes.
    let refused = h.submit(G, "text_vision", 8, h.sink(G));
    assert!(
        matches!(refused, Err(Refusal::Overloaded(_))),
        "{refused:?}"
    );
    assert_eq!(h.sched.stats(), before);

    a_go.send(()).unwrap();

    // D (prepared after B and C) pauses in its first token: the four slots are busy with
    // A, B, C, D, and E and F wait.
    h.wait("D token 1", |e| matches!(e, Ev::Token(D, _)));
    let s = h.sched.stats();
    assert_eq!((s.running, s.queued, s.free_slots), (4, 2, 0));
    assert_eq!(s.rows_per_adapter, [1, 1, 2]);
    let b_slot = s.slots.iter().position(|&x| x == Some(B)).unwrap();
    h.drain();
    assert!(h.records[&B].started && !h.records[&B].tokens.is_empty());
    assert!(h.sched.cancel(B));
    d_go.send(()).unwrap();

    // B's slot goes to E (audio, speech LoRA), which starts from a clean state.
    h.wait("E token 1", |e| matches!(e, Ev::Token(E, _)));
    let s = h.sched.stats();
    assert_eq!(s.slots[b_slot], Some(E));
    assert!(!s.slots.contains(&Some(B)));
    assert_eq!((s.running, s.queued), (4, 1));
    // A late arrival: queued behind F.
    h.submit(H, case(H), max(H), h.sink(H)).unwrap();
    e_go.send(()).unwrap();

    // Some terminal events (B's at least) were already recorded while waiting above.
    let mut pending: Vec<u64> = vec![A, B, C, D, E, F, H];
    pending.retain(|id| h.records.get(id).is_none_or(|r| r.outcome.is_none()));
    while !pending.is_empty() {
        let ev = h.rx.recv_timeout(Duration::from_secs(120)).expect("event");
        if let Ev::Done(id, _) = &ev {
            pending.retain(|p| p != id);
        }
        apply(&mut h.records, ev);
    }

    // B stopped mid-decode: a prefix of its solo run, reported as cancelled.
    let b = &h.records[&B];
    let (b_solo, _) = solo(&pinned_case_input(case(B)), max(B));
    assert!(!b.tokens.is_empty() && b.tokens.len() < max(B));
    assert_eq!(b.tokens[..], b_solo[..b.tokens.len()]);
    assert_eq!(
        b.outcome,
        Some(Outcome::Finished {
            reason: FinishReason::Cancelled,
            prompt_tokens: pinned_case_input(case(B)).input_ids.len(),
            completion_tokens: b.tokens.len(),
        })
    );
    assert!(
        !h.records.contains_key(&G),
        "the refused request got events"
    );
    for (id, case, max) in plan.iter().filter(|p| p.0 != B) {
        let r = &h.records[id];
        let (want, _) = solo(&pinned_case_input(case), *max);
        assert_eq!(&r.tokens, &want, "request {id} ({case}) vs its solo run");
        assert!(matches!(
            r.outcome,
            Some(Outcome::Finished {
                reason: FinishReason::Length,
                ..
            })
        ));
    }
    // The fixture's reference tokens for the cases it has (8 greedy tokens).
    for (id, case, _) in plan.iter().filter(|p| p.0 != B) {
        assert_eq!(h.records[id].tokens[..8], case_tokens(case)[..], "{case}");
    }
    assert_idle(&h.sched.stats(), 4);
    h.sched.shutdown();
}

#[test]
fn disconnect_queued_cancel_and_deadline_free_everything() {
    let mut h = Harness::new(1, 4);
    let (go, g) = gate();
    let mut s1 = h.sink(1);
    s1.pause_at = Some((1, g));
    s1.disconnect_at = Some(3);
    h.submit(1, "text_base", 20, s1).unwrap();
    h.wait("token 1", |e| matches!(e, Ev::Token(1, _)));

    // Queued, then cancelled: its entry goes at once, with a Cancelled finish.
    h.submit(2, "audio_speech", 8, h.sink(2)).unwrap();
    h.wait_stats("2 prepared", |s| s.ready == 1);
    assert!(h.sched.cancel(2));
    h.wait("2 done", |e| matches!(e, Ev::Done(2, _)));
    let s = h.sched.stats();
    assert_eq!((s.queued, s.queued_tokens, s.ready), (0, 0, 0));
    assert!(!h.sched.cancel(2), "a cancelled request is forgotten");

    // Request 1's client goes away at its third token: the slot is freed, no more events.
    go.send(()).unwrap();
    h.wait_stats("slot freed", |s| s.running == 0);
    assert_idle(&h.sched.stats(), 1);
    h.drain();
    assert_eq!(
        h.records[&1].tokens.len(),
        2,
        "no token after the client left"
    );
    assert!(h.records[&1].outcome.is_none());

    // A request whose deadline has passed fails without computing.
    let mut j = job(&h.backend, 3, pinned_case_input("text_base"), 8, h.sink(3));
    j.generation.deadline = Some(Instant::now());
    h.sched.submit(j).unwrap();
    h.wait("3 done", |e| matches!(e, Ev::Done(3, _)));
    assert_eq!(
        h.records[&3].outcome,
        Some(Outcome::Failed(RowError::Deadline))
    );
    assert!(h.records[&3].tokens.is_empty());

    // The slot is clean for the next request: it equals its solo run.
    h.submit(4, "text_speech", 8, h.sink(4)).unwrap();
    h.wait("4 done", |e| matches!(e, Ev::Done(4, _)));
    assert_eq!(h.records[&4].tokens, case_tokens("text_speech"));
    assert_idle(&h.sched.stats(), 1);
}

/// A job cancelled while it waits for the media pool lets go of its media at the cancel, not
/// when a media worker reaches it; the worker then finishes it as cancelled, and a job admitted
/// again under the same id is prepared with its own media.
#[test]
fn cancel_before_prepare_drops_the_media_at_once() {
    let mut h = Harness::new(1, 4);
    // Job 1 holds the only media thread until the test lets it go.
    let (go, g) = gate();
    let (entered_tx, entered) = channel();
    let blocker = Job {
        id: 1,
        prompt_tokens: 4,
        prepare: Box::new(move || {
            entered_tx.send(()).unwrap();
            g.recv_timeout(Duration::from_secs(120)).expect("gate");
            Err(RowError::Invalid("the blocker is never run".into()))
        }),
        generation: GenerationParams::greedy(4),
        sink: Box::new(h.sink(1)),
    };
    h.sched.submit(blocker).unwrap();
    entered
        .recv_timeout(Duration::from_secs(60))
        .expect("the media thread runs job 1");

    // Job 2 owns a large buffer through its prepare function.
    let media = Arc::new(vec![7u8; 64 << 20]);
    let held = media.clone();
    let heavy = Job {
        id: 2,
        prompt_tokens: 4,
        prepare: Box::new(move || {
            let _ = held.len();
            Err(RowError::Invalid(
                "cancelled jobs are never prepared".into(),
            ))
        }),
        generation: GenerationParams::greedy(4),
        sink: Box::new(h.sink(2)),
    };
    h.sched.submit(heavy).unwrap();
    assert_eq!(Arc::strong_count(&media), 2, "the queue holds the media");
    assert!(h.sched.cancel(2));
    assert_eq!(
        Arc::strong_count(&media),
        1,
        "the media went with the cancel, while the media pool is still busy"
    );
    let s = h.sched.stats();
    assert_eq!((s.queued, s.queued_tokens), (1, 4));

    // The same id admitted again before the worker reaches the old job: the old one finishes
    // cancelled without taking the new one's media, and the new one is prepared as usual.
    h.submit(2, "text_base", 4, h.sink(2)).unwrap();
    go.send(()).unwrap();
    h.wait("1 done", |e| matches!(e, Ev::Done(1, _)));
    h.wait("2 cancelled", |e| matches!(e, Ev::Done(2, _)));
    assert_eq!(
        h.records[&2].outcome,
        Some(Outcome::Finished {
            reason: FinishReason::Cancelled,
            prompt_tokens: 0,
            completion_tokens: 0,
        })
    );
    h.records.remove(&2);
    h.wait("2 done", |e| matches!(e, Ev::Done(2, _)));
    assert_eq!(h.records[&2].tokens, case_tokens("text_base")[..4]);
    assert_idle(&h.sched.stats(), 1);
}

/// A job cancelled while a media worker prepares it, then admitted again under the same id: the
/// old preparation, however it ends (a prompt or an error), finishes the old job as cancelled and
/// neither delivers to nor removes the new one, which runs as usual. Gates order every step, so
/// the test assumes no timing.
#[test]
fn a_job_cancelled_while_preparing_leaves_a_resubmitted_id_alone() {
    const OLD: u64 = 20; // sink tags: both jobs have the request id 2
    const NEW: u64 = 21;
    for old_fails in [false, true] {
        let mut h = Harness::new(1, 4);
        let (go, g) = gate();
        let (entered_tx, entered) = channel();
        let real = h
            .backend
            .media_stage()
            .prepare_fn(pinned_case_input("text_base"), 4);
        let old = Job {
            id: 2,
            prompt_tokens: 4,
            prepare: Box::new(move || {
                entered_tx.send(()).unwrap();
                g.recv_timeout(Duration::from_secs(120)).expect("gate");
                if old_fails {
                    Err(RowError::Invalid("the old preparation fails".into()))
                } else {
                    real()
                }
            }),
            generation: GenerationParams::greedy(4),
            sink: Box::new(h.sink(OLD)),
        };
        h.sched.submit(old).unwrap();
        entered
            .recv_timeout(Duration::from_secs(60))
            .expect("a media worker prepares the old job");
        assert!(h.sched.cancel(2));
        h.submit(2, "text_base", 4, h.sink(NEW)).unwrap();
        go.send(()).unwrap();
        let ended =
            |h: &Harness, tag: u64| h.records.get(&tag).is_some_and(|r| r.outcome.is_some());
        while !(ended(&h, OLD) && ended(&h, NEW)) {
            h.wait("both jobs to end", |_| true);
        }
        h.drain();
        let old = &h.records[&OLD];
        assert_eq!(
            (old.started, old.tokens.len(), old.outcome.clone()),
            (
                false,
                0,
                Some(Outcome::Finished {
                    reason: FinishReason::Cancelled,
                    prompt_tokens: 0,
                    completion_tokens: 0,
                })
            ),
            "old preparation failing: {old_fails}"
        );
        let new = &h.records[&NEW];
        assert_eq!(
            new.tokens,
            case_tokens("text_base")[..4],
            "old preparation failing: {old_fails}: {new:?}"
        );
        assert!(
            matches!(new.outcome, Some(Outcome::Finished { reason, .. }) if reason != FinishReason::Cancelled),
            "old preparation failing: {old_fails}: {new:?}"
        );
        assert_idle(&h.wait_stats("idle", |s| s.running == 0), 1);
    }
}

/// The KV positions in the stats (the plugin's `vllm:kv_cache_usage_perc`) follow the rows:
/// frozen inside token `n`, the stats are those published after token `n - 1`'s step, when the
/// cache held the prompt plus the `n - 2` tokens fed back since; an idle scheduler holds none.
#[test]
fn kv_positions_follow_the_rows_and_their_tokens() {
    let mut h = Harness::new(2, 0);
    let frozen_at = |h: &mut Harness, id: u64, n: usize| {
        let (go, gate) = gate();
        let mut sink = h.sink(id);
        sink.pause_at = Some((n, gate));
        h.submit(id, "text_base", 8, sink).unwrap();
        // Tokens 1..n are reported before the sink freezes in token n.
        let seen = std::cell::Cell::new(0);
        h.wait("the frozen token", |e| {
            if matches!(e, Ev::Token(i, _) if *i == id) {
                seen.set(seen.get() + 1);
            }
            seen.get() == n
        });
        go
    };
    let done = |h: &mut Harness, id: u64| {
        h.wait("the end", |e| matches!(e, Ev::Done(i, _) if *i == id));
    };
    let prompt = pinned_case_input("text_base").input_ids.len();
    let go = frozen_at(&mut h, 1, 3);
    assert_eq!(h.sched.stats().kv_positions, prompt + 1);
    go.send(()).unwrap();
    done(&mut h, 1);
    assert_eq!(h.wait_stats("idle", |s| s.running == 0).kv_positions, 0);

    let go = frozen_at(&mut h, 2, 6);
    assert_eq!(h.sched.stats().kv_positions, prompt + 4);
    go.send(()).unwrap();
    done(&mut h, 2);
    assert_idle(&h.wait_stats("idle", |s| s.running == 0), 2);
}

/// The KV pool: a request whose row can never fit the pool is refused as invalid (HTTP 400),
/// one that fits only once a running row is gone as overloaded (HTTP 429), and neither changes
/// anything; the bytes come back when the row ends, and the waiting request is then admitted.
#[test]
fn the_kv_pool_refuses_what_never_fits_and_what_must_wait() {
    let prompt = pinned_case_input("text_base").input_ids.len();
    let row = HostBackend(model()).kv_bytes(prompt + 8);
    // Room for one such row, not two.
    let mut h = Harness::with_kv(4, 4, KvBudget::Bytes(row + row / 2));
    assert_eq!(h.sched.stats().kv_pool_bytes, row + row / 2);
    let (go, gate) = gate();
    let mut sink = h.sink(1);
    sink.pause_at = Some((1, gate));
    h.submit(1, "text_base", 8, sink).unwrap();
    h.wait("row 1 runs", |e| matches!(e, Ev::Token(1, _)));
    assert_eq!(h.sched.stats().kv_reserved_bytes, row);

    let waits = h.submit(2, "text_base", 8, h.sink(2));
    assert!(
        matches!(&waits, Err(Refusal::Overloaded(m)) if m.contains("kv_cache_bytes")),
        "{waits:?}"
    );
    let never = h.submit(3, "text_base", 100_000, h.sink(3));
    assert!(
        matches!(&never, Err(Refusal::Invalid(m)) if m.contains("kv_cache_bytes")),
        "{never:?}"
    );
    let s = h.sched.stats();
    assert_eq!((s.queued, s.kv_reserved_bytes), (0, row));

    go.send(()).unwrap();
    h.wait("row 1 ends", |e| matches!(e, Ev::Done(1, _)));
    h.wait_stats("the pool is free", |s| s.kv_reserved_bytes == 0);
    h.submit(2, "text_base", 8, h.sink(2)).unwrap();
    h.wait("row 2 ends", |e| matches!(e, Ev::Done(2, _)));
    assert_eq!(h.records[&2].tokens, h.records[&1].tokens);
    assert_idle(&h.wait_stats("idle", |s| s.running == 0), 4);
}

/// The prefill budget of a step is shared fairly: a short prompt admitted beside a long one
/// finishes its whole answer before the long prompt's prefill ends. (With the budget given in
/// slot order, the long prompt in the lower slot took all of it, and the short one waited for
/// its whole prefill.)
#[test]
fn a_short_prompt_beside_a_long_one_is_answered_before_the_long_prefill_ends() {
    const PREFILL_CHUNK: usize = 32;
    let mut h = Harness::with_config(SchedulerConfig {
        slots: 3,
        prefill_chunk: PREFILL_CHUNK,
        ..SchedulerConfig::default()
    });
    const HOLD: u64 = 1; // holds the scheduler in its first token while the others arrive
    const LONG: u64 = 2; // 684 prompt tokens: 22 steps of prefill alone
    const SHORT: u64 = 3; // 21 prompt tokens
    let (go, hold_gate) = gate();
    let mut hold = h.sink(HOLD);
    hold.pause_at = Some((1, hold_gate));
    h.submit(HOLD, "text_speech", 4, hold).unwrap();
    h.wait("the holder's first token", |e| {
        matches!(e, Ev::Token(HOLD, _))
    });
    h.submit(LONG, "image_vision", 2, h.sink(LONG)).unwrap();
    h.submit(SHORT, "text_base", 3, h.sink(SHORT)).unwrap();
    // Both prepared: the next admission takes them into the same step, LONG in the lower slot.
    h.wait_stats("both prepared", |s| s.ready == 2);
    go.send(()).unwrap();
    h.wait("the short answer", |e| matches!(e, Ev::Done(SHORT, _)));
    let long = h.records.get(&LONG).map(|r| r.tokens.clone());
    assert!(
        long.as_ref().is_none_or(Vec::is_empty),
        "the long prompt's tokens came before the short answer ended: {long:?}"
    );
    assert_eq!(h.records[&SHORT].tokens, case_tokens("text_base")[..3]);
    h.wait("the long answer", |e| matches!(e, Ev::Done(LONG, _)));
    assert_eq!(h.records[&LONG].tokens, case_tokens("image_vision")[..2]);
}
