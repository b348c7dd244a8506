//! Both `mixed_batches` of the fixture through the real scheduler: each row's tokens equal the
//! fixture's reference tokens and its solo run, and its first logits are within the fixture
//! tolerance of the reference.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::model_support::*;
use crate::scheduler_support::*;
use switchyard_phi4mm::model::HostBackend;
use switchyard_phi4mm::scheduler::{FinishReason, Outcome, Scheduler, SchedulerConfig};

fn run_batch(batch: &str, prefill_chunk: usize) {
    let b = &manifest()["mixed_batches"][batch];
    let cases: Vec<&str> = b["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let backend = Arc::new(HostBackend(model()));
    let sched = Scheduler::start(
        backend.clone(),
        SchedulerConfig {
            slots: cases.len(),
            max_queued: 0,
            prefill_chunk,
            media_threads: 2,
            ..SchedulerConfig::default()
        },
        None,
    )
    .unwrap();
    let (tx, rx) = new_channel();
    for (i, case) in cases.iter().enumerate() {
        let sink = ChannelSink::new(i as u64, tx.clone());
        sched
            .submit(job(&backend, i as u64, pinned_case_input(case), 8, sink))
            .unwrap();
    }
    let mut records = HashMap::new();
    let mut done = 0;
    while done < cases.len() {
        let ev = rx.recv_timeout(Duration::from_secs(300)).expect("event");
        let finished = matches!(ev, Ev::Done(..));
        apply(&mut records, ev);
        done += finished as usize;
    }
    for (i, case) in cases.iter().enumerate() {
        let r = &records[&(i as u64)];
        assert_eq!(
            r.outcome,
            Some(Outcome::Finished {
                reason: FinishReason::Length,
                prompt_tokens: pinned_case_input(case).input_ids.len(),
                completion_tokens: 8
            }),
            "{batch} row {i}"
        );
        let want = mixed_row_tokens(batch, i);
        assert_eq!(r.tokens, want, "{batch} row {i} ({case}) vs reference");
        let (solo_tokens, solo_logits) = solo(&pinned_case_input(case), 8);
        assert_eq!(r.tokens, solo_tokens, "{batch} row {i} ({case}) vs solo");
        let (ref_logits, _) = model_cases().f32(&format!("{case}.logits_first"));
        let got = r.logits_first.as_ref().expect("first logits");
        assert_matches_reference(
            &format!("{batch} row {i} logits"),
            got,
            &ref_logits,
            1e-4,
            1e-4,
        );
        assert_matches_reference(
            &format!("{batch} row {i} vs solo"),
            got,
            &solo_logits,
            1e-4,
            1e-4,
        );
    }
    let s = sched.stats();
    assert_eq!((s.running, s.queued, s.queued_tokens), (0, 0, 0));
    assert_eq!(s.free_slots, cases.len());
    sched.shutdown();
}

#[test]
fn mixed_audio_text_through_the_scheduler() {
    run_batch("mixed_audio_text", 4096);
}

#[test]
fn mixed_image_text_through_the_scheduler() {
    run_batch("mixed_image_text", 4096);
}

/// Long prompts prefilled in chunks interleaved with other rows' decode give the same tokens.
#[test]
fn mixed_image_text_with_chunked_prefill() {
    run_batch("mixed_image_text", 100);
}
