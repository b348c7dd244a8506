//! Helpers for the scheduler tests: fixture requests as model inputs, solo reference runs, and a
//! sink that forwards every event to a channel (optionally pausing the scheduler on a token).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::model_support::*;
use switchyard_phi4mm::adapter::AdapterChoice;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::{HostBackend, Phi4mm, PromptInput};
use switchyard_phi4mm::sampling::Logprobs;
use switchyard_phi4mm::scheduler::{GenerationParams, Job, Outcome, RowSink};

pub fn model() -> Arc<Phi4mm> {
    static M: OnceLock<Arc<Phi4mm>> = OnceLock::new();
    M.get_or_init(|| {
        Arc::new(Phi4mm::load(
            &Checkpoint::open(&fixture().join("model")).unwrap(),
            2,
        ))
    })
    .clone()
}

/// A fixture model case as a request, with the adapter the case names pinned.
pub fn pinned_case_input(case: &str) -> PromptInput {
    PromptInput {
        adapter: AdapterChoice::Fixed(case_adapter(case)),
        ..crate::model_support::case_input(case)
    }
}

/// The case's greedy tokens from the fixture (reference numbers).
pub fn case_tokens(case: &str) -> Vec<u32> {
    manifest()["model_cases"]["cases"][case]["greedy_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// The solo path: the request alone through greedy decoding on the host backend, no early stop.
pub fn solo(input: &PromptInput, max_new_tokens: usize) -> (Vec<u32>, Vec<f32>) {
    let model = model();
    let p = model.prepare(input, max_new_tokens).unwrap();
    let g = host_greedy(&model, &p, max_new_tokens);
    (g.tokens, g.logits_first)
}

#[derive(Debug)]
pub enum Ev {
    Started(u64),
    Token(u64, u32),
    Logits(u64, Vec<f32>),
    Done(u64, Outcome),
}

pub struct ChannelSink {
    pub id: u64,
    pub tx: Sender<Ev>,
    /// Before reporting token number `n` (1-based), block until the test sends on this channel:
    /// the scheduler thread waits, which freezes the batch at a known point.
    pub pause_at: Option<(usize, Receiver<()>)>,
    /// Report the client gone at token number `n`.
    pub disconnect_at: Option<usize>,
    seen: usize,
}

impl ChannelSink {
    pub fn new(id: u64, tx: Sender<Ev>) -> Self {
        ChannelSink {
            id,
            tx,
            pause_at: None,
            disconnect_at: None,
            seen: 0,
        }
    }
}

impl RowSink for ChannelSink {
    fn started(&mut self, _prompt_tokens: usize) -> bool {
        self.tx.send(Ev::Started(self.id)).is_ok()
    }
    fn token(&mut self, id: u32, _text: &str, _: Option<&Logprobs>) -> bool {
        self.seen += 1;
        if let Some((n, gate)) = &self.pause_at {
            if *n == self.seen {
                let _ = self.tx.send(Ev::Token(self.id, id));
                gate.recv_timeout(Duration::from_secs(120)).expect("gate");
                return true;
            }
        }
        if self.disconnect_at == Some(self.seen) {
            return false;
        }
        self.tx.send(Ev::Token(self.id, id)).is_ok()
    }
    fn first_logits(&mut self, logits: &[f32]) {
        let _ = self.tx.send(Ev::Logits(self.id, logits.to_vec()));
    }
    fn done(&mut self, outcome: Outcome) {
        let _ = self.tx.send(Ev::Done(self.id, outcome));
    }
}

/// A greedy job for a fixture request through the host backend's media stage.
pub fn job(
    backend: &HostBackend,
    id: u64,
    input: PromptInput,
    max: usize,
    sink: ChannelSink,
) -> Job {
    Job {
        id,
        prompt_tokens: input.input_ids.len(),
        prepare: backend.media_stage().prepare_fn(input, max),
        generation: GenerationParams::greedy(max),
        sink: Box::new(sink),
    }
}

/// Per-request record collected from events.
#[derive(Default, Debug, Clone)]
pub struct Record {
    pub started: bool,
    pub tokens: Vec<u32>,
    pub logits_first: Option<Vec<f32>>,
    pub outcome: Option<Outcome>,
}

pub fn apply(records: &mut std::collections::HashMap<u64, Record>, ev: Ev) -> u64 {
    match ev {
        Ev::Started(id) => {
            records.entry(id).or_default().started = true;
            id
        }
        Ev::Token(id, t) => {
            records.entry(id).or_default().tokens.push(t);
            id
        }
        Ev::Logits(id, l) => {
            records.entry(id).or_default().logits_first = Some(l);
            id
        }
        Ev::Done(id, o) => {
            records.entry(id).or_default().outcome = Some(o);
            id
        }
    }
}

pub fn new_channel() -> (Sender<Ev>, Receiver<Ev>) {
    channel()
}
