//! An echo model for tests and the demo: streams the text of the request back, one word per
//! token. Settings (all optional):
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `token_delay_ms` | 0 | pause before each token |
//! | `slots` | 8 | requests computed at once |
//! | `queue` | 64 | requests admitted beyond the slots; more are refused (`Overloaded`) |
//! | `label` | "" | a version string of the instance, shown in tagged tokens |
//! | `tag_tokens` | false | prefix every token with `[plugin@version/label]` |
//! | `fail_on_create` / `panic_on_create` | false | model creation fails / panics |
//! | `panic_on_check` | false | the settings check (`switchyard config check`, reloads) panics |
//! | `check_delay_ms` | 0 | the settings check sleeps this long first (a checkpoint on a hung mount) |
//! | `fail_on_warm` | false | warm-up fails |
//! | `warm_delay_ms` | 0 | warm-up sleeps this long first (a slow or hung warm-up) |
//! | `inline` | false | answer inside `submit` on the caller's thread, without admission (measures the bare ABI cost) |
//! | `pool` | false | run every request on the worker pool, even with no token delay |
//! | `kv_tokens_per_slot` | 1024 | the KV capacity `resources()` reports per slot |
//! | `adapters` | [] | adapter names `resources()` reports as resident |
//!
//! Execution: a request with a token delay runs on a worker thread of a pool of at most `slots`
//! threads, started on demand and reused. With no delay there is nothing to wait for, so it is
//! admitted as usual and answered within `submit` on the caller's thread (unless `pool`).
//!
//! Resources (API 2.1): a running request holds one KV position per prompt word and one per
//! token sent, as a decoder's cache would; capacity is `slots × kv_tokens_per_slot`.
//!
//! Log probabilities: echo's distribution is a point mass on the echoed word, so every token has
//! logprob 0 and is its own only alternative. Model options: none; any key is refused, named.
//!
//! Completions (`submit_prompt`): a text prompt is echoed as the text of one user message would
//! be; a prompt of token ids echoes each id as a word.
//!
//! Requests whose text contains `#fail` fail after their first token; `#panic` panics inside
//! `submit`; `#panic-worker` panics while streaming, after the first token. These exist so
//! tests can prove that the host keeps serving.

use serde::Deserialize;
use std::{
    cell::Cell,
    collections::{HashMap, VecDeque},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Mutex,
    },
    thread,
    time::Duration,
};
use switchyard_plugin_api::{
    abi_stable::std_types::{ROption, RString},
    AdapterRows, Endpoint, Event, EventSinkBox, FinishReason, HostServices, Message, Modality,
    ModelKindInfo, ModelResources, ModelStats, Part, PluginError, PluginManifest, PluginModel,
    Prompt, Request, Role, SettingsText, TokenLogprob, TokenLogprobs, Usage, API_VERSION,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoSettings {
    #[serde(default)]
    pub token_delay_ms: u64,
    #[serde(default = "default_slots")]
    pub slots: u32,
    #[serde(default = "default_queue")]
    pub queue: u32,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub tag_tokens: bool,
    #[serde(default)]
    pub fail_on_create: bool,
    #[serde(default)]
    pub panic_on_create: bool,
    #[serde(default)]
    pub panic_on_check: bool,
    #[serde(default)]
    pub check_delay_ms: u64,
    #[serde(default)]
    pub fail_on_warm: bool,
    #[serde(default)]
    pub warm_delay_ms: u64,
    #[serde(default)]
    pub inline: bool,
    #[serde(default)]
    pub pool: bool,
    #[serde(default = "default_kv_tokens_per_slot")]
    pub kv_tokens_per_slot: u64,
    #[serde(default)]
    pub adapters: Vec<String>,
}

fn default_kv_tokens_per_slot() -> u64 {
    1024
}

fn default_slots() -> u32 {
    8
}
fn default_queue() -> u32 {
    64
}

/// Which plugin this build is: the identity goes into the manifest and into tagged tokens.
#[derive(Debug, Clone, Copy)]
pub struct Flavour {
    pub plugin: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Accepts images and audio (describing them) and serves transcriptions.
    pub media: bool,
}

pub fn manifest(flavour: Flavour) -> PluginManifest {
    let (chat, transcription) = if flavour.media {
        (Modality::ALL.to_vec(), vec![Modality::Audio])
    } else {
        (vec![Modality::Text], vec![])
    };
    PluginManifest {
        name: flavour.plugin.into(),
        version: flavour.version.into(),
        build_id: format!("{}-{}", flavour.plugin, flavour.version).into(),
        api_version: API_VERSION,
        models: vec![ModelKindInfo {
            kind: flavour.kind.into(),
            chat_modalities: chat.into(),
            transcription_modalities: transcription.into(),
        }]
        .into(),
    }
}

pub fn create(
    flavour: Flavour,
    kind: &str,
    settings: SettingsText,
    services: HostServices,
) -> Result<EchoModel, PluginError> {
    let settings = settings_of(flavour, kind, &settings)?;
    if settings.panic_on_create {
        panic!("panic_on_create is set");
    }
    if settings.fail_on_create {
        return Err(PluginError::invalid_settings("fail_on_create is set"));
    }
    services.info(&format!(
        "{} model created: {} slots, queue {}, {} ms per token",
        flavour.plugin, settings.slots, settings.queue, settings.token_delay_ms
    ));
    Ok(EchoModel {
        flavour,
        kind: manifest(flavour).models[0].clone(),
        prefix: settings.tag_tokens.then(|| {
            format!(
                "[{}@{}/{}]",
                flavour.plugin, flavour.version, settings.label
            )
        }),
        settings,
        shared: Arc::new(Shared {
            state: Mutex::new(State::default()),
            kv_used: AtomicU64::new(0),
        }),
    })
}

/// Whether [`create`] would accept `kind` and `settings` (the plugin's settings check, API
/// 2.2). The `*_on_create` hooks are settings like any other here: they fail the creation.
pub fn check(
    flavour: Flavour,
    kind: &str,
    settings: SettingsText,
    _config_dir: &std::path::Path,
) -> Result<(), PluginError> {
    let settings = settings_of(flavour, kind, &settings)?;
    thread::sleep(Duration::from_millis(settings.check_delay_ms));
    if settings.panic_on_check {
        panic!("panic_on_check is set");
    }
    Ok(())
}

/// The settings of a model of `kind`, parsed and validated: what creating and checking share.
fn settings_of(
    flavour: Flavour,
    kind: &str,
    settings: &SettingsText,
) -> Result<EchoSettings, PluginError> {
    if kind != flavour.kind {
        return Err(PluginError::invalid_settings(format!(
            "plugin {} has no model kind {kind:?} (it has {:?})",
            flavour.plugin, flavour.kind
        )));
    }
    let settings: EchoSettings = settings.parse().map_err(PluginError::invalid_settings)?;
    if settings.slots == 0 {
        return Err(PluginError::invalid_settings("slots must be at least 1"));
    }
    Ok(settings)
}

pub struct EchoModel {
    flavour: Flavour,
    /// What this flavour serves (the manifest's entry, built once).
    kind: ModelKindInfo,
    settings: EchoSettings,
    /// What `tag_tokens` puts before every token, built once.
    prefix: Option<String>,
    shared: Arc<Shared>,
}

/// The execution model: a pool of worker threads, at most `slots`, started on demand and kept
/// for the next requests (a thread per request cost more than the rest of a zero-delay
/// request). A running request owns one worker; requests beyond the slots wait in `queue`, in
/// order, and a worker that finishes takes the next one.
struct Shared {
    state: Mutex<State>,
    /// KV positions held by running requests (see the module doc); kept outside the lock so a
    /// token costs no extra locking.
    kv_used: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Cancel flags of the requests admitted to the workers (queued or running).
    requests: HashMap<u64, Arc<AtomicBool>>,
    /// Requests being answered inside `submit` (no token delay): they run on the caller's
    /// thread, at once, so they are neither queued nor cancellable.
    answering: u32,
    /// Admitted requests waiting for a slot.
    queue: VecDeque<Job>,
    /// How to hand a job to each idle worker, the most recently idle last.
    idle: Vec<mpsc::Sender<Job>>,
    /// Every worker started, joined on shutdown.
    workers: Vec<thread::JoinHandle<()>>,
    running: u32,
    draining: bool,
    stopped: bool,
}

impl State {
    fn queued(&self) -> u32 {
        self.requests.len() as u32 - self.running
    }

    fn admitted(&self) -> u32 {
        self.requests.len() as u32 + self.answering
    }
}

impl PluginModel for EchoModel {
    fn warm(&self) -> Result<(), PluginError> {
        thread::sleep(Duration::from_millis(self.settings.warm_delay_ms));
        if self.settings.fail_on_warm {
            return Err(PluginError::internal("fail_on_warm is set"));
        }
        Ok(())
    }

    fn submit(&self, request: Request, sink: EventSinkBox) -> Result<(), PluginError> {
        let tokens = self.tokens_of(&request)?;
        let hooks = Hooks::of(&tokens, self.prefix.as_deref().unwrap_or(""));
        if hooks.panic {
            panic!("the request asked for a panic");
        }
        let logprobs = request.logprobs.into_option();
        if self.settings.inline {
            return self.answer_inline(tokens, logprobs, &sink);
        }
        let mut state = self.shared.state.lock().unwrap();
        if state.draining {
            return Err(PluginError::unavailable("instance is draining"));
        }
        if state.admitted() >= self.settings.slots + self.settings.queue {
            return Err(PluginError::overloaded(format!(
                "{} requests admitted (slots {} + queue {})",
                state.admitted(),
                self.settings.slots,
                self.settings.queue
            )));
        }
        let delay = Duration::from_millis(self.settings.token_delay_ms);
        // Nothing to wait for: answered here, never queued (so never waiting for a worker),
        // and so never cancelled either.
        let answer_here = delay.is_zero() && !self.settings.pool;
        let cancel = (!answer_here).then(|| Arc::new(AtomicBool::new(false)));
        let job = Job {
            id: request.id,
            tokens: Cell::new(tokens),
            hooks,
            max_tokens: request.sampling.max_tokens.into_option(),
            stop: request.stop.iter().map(|s| s.to_string()).collect(),
            logprobs,
            delay,
            kv_held: Cell::new(0),
            cancel: cancel.clone(),
            sink,
            shared: self.shared.clone(),
        };
        let Some(cancel) = cancel else {
            state.answering += 1;
            drop(state);
            job.run();
            self.shared.state.lock().unwrap().answering -= 1;
            return Ok(());
        };
        if state.running >= self.settings.slots {
            state.requests.insert(request.id, cancel);
            state.queue.push_back(job);
            return Ok(());
        }
        let job = match state.idle.pop() {
            Some(worker) => match worker.send(job) {
                Ok(()) => None,
                // A worker that is gone (it cannot be: workers exit only when stopped).
                Err(mpsc::SendError(job)) => Some(job),
            },
            None => Some(job),
        };
        if let Some(job) = job {
            let shared = self.shared.clone();
            let handle = thread::Builder::new()
                .name("echo-worker".into())
                .spawn(move || worker(shared, job))
                .map_err(|e| PluginError::internal(format!("cannot start worker: {e}")))?;
            state.workers.push(handle);
        }
        state.requests.insert(request.id, cancel);
        state.running += 1;
        Ok(())
    }

    fn submit_prompt(
        &self,
        mut request: Request,
        prompt: Prompt,
        sink: EventSinkBox,
    ) -> Result<(), PluginError> {
        let text = match prompt {
            Prompt::Text(text) => text,
            Prompt::Tokens(ids) => ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" "),
        };
        request.messages = vec![Message::text(Role::User, text)].into();
        self.submit(request, sink)
    }

    fn cancel(&self, request_id: u64) -> bool {
        let mut state = self.shared.state.lock().unwrap();
        let Some(flag) = state.requests.get(&request_id) else {
            return false;
        };
        flag.store(true, Ordering::SeqCst);
        // A queued request ends at once; a running one at its worker's next token.
        if let Some(at) = state.queue.iter().position(|job| job.id == request_id) {
            let job = state
                .queue
                .remove(at)
                .expect("the position is in the queue");
            state.requests.remove(&request_id);
            drop(state);
            job.cancelled();
        }
        true
    }

    fn stats(&self) -> ModelStats {
        let state = self.shared.state.lock().unwrap();
        ModelStats {
            running: state.running + state.answering,
            queued: state.queued(),
            free_slots: self
                .settings
                .slots
                .saturating_sub(state.running + state.answering),
            adapters: vec![AdapterRows {
                adapter: "base".into(),
                rows: state.running + state.answering,
            }]
            .into(),
            details_json: RString::from(format!(
                "{{\"label\":{:?},\"draining\":{}}}",
                self.settings.label, state.draining
            )),
        }
    }

    fn resources(&self) -> ModelResources {
        let adapters = self.settings.adapters.clone();
        ModelResources {
            kv_capacity_tokens: u64::from(self.settings.slots) * self.settings.kv_tokens_per_slot,
            kv_used_tokens: self.shared.kv_used.load(Ordering::Relaxed),
            max_adapters: adapters.len() as u32,
            resident_adapters: adapters,
            waiting_adapters: Vec::new(),
        }
    }

    fn drain(&self) {
        self.shared.state.lock().unwrap().draining = true;
    }

    fn shutdown(&self) {
        let (queued, workers) = {
            let mut state = self.shared.state.lock().unwrap();
            state.draining = true;
            state.stopped = true;
            for flag in state.requests.values() {
                flag.store(true, Ordering::SeqCst);
            }
            let queued: Vec<Job> = state.queue.drain(..).collect();
            for job in &queued {
                state.requests.remove(&job.id);
            }
            // Dropping an idle worker's sender ends it; a busy one ends after its request.
            state.idle.clear();
            (queued, std::mem::take(&mut state.workers))
        };
        for job in queued {
            job.cancelled();
        }
        for worker in workers {
            let _ = worker.join();
        }
    }
}

/// One worker thread: runs `job`, then the queued ones, then waits to be handed the next.
fn worker(shared: Arc<Shared>, mut job: Job) {
    loop {
        job.run();
        let mut state = shared.state.lock().unwrap();
        state.requests.remove(&job.id);
        if let Some(next) = state.queue.pop_front() {
            job = next;
            continue;
        }
        state.running -= 1;
        if state.stopped {
            return;
        }
        // Only the idle list holds the sender, so clearing it (shutdown) ends this thread.
        let (tx, rx) = mpsc::channel();
        state.idle.push(tx);
        drop(state);
        match rx.recv() {
            Ok(next) => job = next,
            Err(mpsc::RecvError) => return,
        }
    }
}

impl EchoModel {
    /// The whole answer inside `submit`: no thread, no queue; what is left is the ABI and the
    /// host's event channel.
    fn answer_inline(
        &self,
        tokens: Vec<String>,
        logprobs: Option<u8>,
        sink: &EventSinkBox,
    ) -> Result<(), PluginError> {
        let prompt_tokens = tokens.len() as u32;
        sink.send(Event::Started { prompt_tokens });
        for (i, piece) in tokens.into_iter().enumerate() {
            sink.send(token_event(i as u32, piece, logprobs));
        }
        let usage = Usage {
            prompt_tokens,
            completion_tokens: prompt_tokens,
        };
        sink.send(Event::Finished {
            reason: FinishReason::Stop,
            usage,
        });
        Ok(())
    }

    /// The tokens to stream, as their text (see [`push_piece`]): the words of the last user
    /// message, and a description of each media part when this flavour accepts media.
    fn tokens_of(&self, request: &Request) -> Result<Vec<String>, PluginError> {
        let options = request
            .model_options_json()
            .map_err(PluginError::invalid_request)?;
        if let Some(key) = options.as_ref().and_then(|o| o.keys().next()) {
            return Err(PluginError::invalid_request(format!(
                "model_options.{key}: {} takes no model options",
                self.flavour.plugin
            )));
        }
        let modality = request.modality();
        let accepted = self.kind.accepts(request.endpoint, modality);
        if !accepted {
            return Err(PluginError::new(
                switchyard_plugin_api::ErrorKind::Unsupported,
                format!(
                    "{} does not serve {modality} on {:?}",
                    self.flavour.plugin, request.endpoint
                ),
            ));
        }
        let message = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == switchyard_plugin_api::Role::User)
            .ok_or_else(|| PluginError::invalid_request("no user message"))?;
        let prefix = self.prefix.as_deref().unwrap_or("");
        let mut tokens = Vec::new();
        if request.endpoint == Endpoint::Transcription {
            push_piece(&mut tokens, prefix, "transcript:");
        }
        for part in message.parts.iter() {
            match part {
                Part::Text(text) => {
                    for word in text.split_whitespace() {
                        push_piece(&mut tokens, prefix, word);
                    }
                }
                Part::Image(bytes) if bytes.is_empty() => {
                    return Err(PluginError::invalid_request("empty image"))
                }
                Part::Image(bytes) => {
                    push_piece(&mut tokens, prefix, &format!("[image:{}B]", bytes.len()))
                }
                Part::Audio { data, .. } if data.is_empty() => {
                    return Err(PluginError::invalid_request("empty audio clip"))
                }
                Part::Audio { data, format } => push_piece(
                    &mut tokens,
                    prefix,
                    &format!("[audio:{format}:{}B]", data.len()),
                ),
            }
        }
        Ok(tokens)
    }
}

/// The test hooks a request's words ask for (see the crate's documentation), read once in
/// `submit` rather than searched for again while streaming.
#[derive(Clone, Copy, Default)]
struct Hooks {
    /// `#panic`: panic inside `submit`.
    panic: bool,
    /// `#panic-worker`: panic while streaming, after the first token.
    panic_worker: bool,
    /// `#fail`: fail after the first token.
    fail: bool,
}

impl Hooks {
    /// The hooks in the words of `tokens`, whose text is each word after `prefix` (the tag,
    /// which is the operator's and asks for nothing).
    fn of(tokens: &[String], prefix: &str) -> Self {
        let mut hooks = Self::default();
        // Words without a `#` are skipped before anything is stripped. Stripping the empty
        // prefix (no tag) calls `memcmp` with length 0 on the dangling pointer of `""`, and
        // glibc's AVX-512 `memcmp` takes about 100 ns for that on AMD's Zen 5 (the fault of
        // its masked load is suppressed with a slow assist): nine of them were 0.5–1 µs of
        // a 15 µs request in the router benchmark (scripts/bench-memcmp-assist.sh,
        // docs/benchmarks.md).
        let words = tokens.iter().filter(|t| t.contains('#')).map(|t| {
            let t = t.strip_prefix(' ').unwrap_or(t);
            t.strip_prefix(prefix).unwrap_or(t)
        });
        for word in words.filter(|w| w.contains('#')) {
            let panic_worker = word.contains("#panic-worker");
            hooks.panic_worker |= panic_worker;
            hooks.panic |= word.contains("#panic") && !panic_worker;
            hooks.fail |= word.contains("#fail");
        }
        hooks
    }
}

struct Job {
    id: u64,
    /// The text of each token to send, taken when the job runs: each goes out as its event's
    /// text, allocated once, as a model's detokenizer would.
    tokens: Cell<Vec<String>>,
    hooks: Hooks,
    max_tokens: Option<u32>,
    stop: Vec<String>,
    logprobs: Option<u8>,
    delay: Duration,
    /// This request's share of [`Shared::kv_used`].
    kv_held: Cell<u64>,
    /// Set by `cancel`; `None` for a job answered within `submit`, which nothing can cancel.
    cancel: Option<Arc<AtomicBool>>,
    sink: EventSinkBox,
    shared: Arc<Shared>,
}

impl Job {
    /// Streams the answer on the worker's thread; its slot is the caller's to give back.
    fn run(&self) {
        if self.cancelled_now() {
            return self.cancelled();
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.stream()));
        if let Err(payload) = outcome {
            // A request must never end silently: the host waits for a terminal event.
            self.sink.send(Event::Failed(PluginError::from_panic(
                "echo worker",
                payload,
            )));
        }
        self.shared
            .kv_used
            .fetch_sub(self.kv_held.replace(0), Ordering::Relaxed);
    }

    fn cancelled_now(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|cancel| cancel.load(Ordering::SeqCst))
    }

    fn hold_kv(&self, positions: u64) {
        self.kv_held.set(self.kv_held.get() + positions);
        self.shared.kv_used.fetch_add(positions, Ordering::Relaxed);
    }

    /// The end of a request cancelled before it ran.
    fn cancelled(&self) {
        self.sink.send(Event::Finished {
            reason: FinishReason::Cancelled,
            usage: Usage::default(),
        });
    }

    fn stream(&self) {
        let tokens = self.tokens.take();
        let prompt_tokens = tokens.len() as u32;
        self.hold_kv(u64::from(prompt_tokens));
        if !self.sink.send(Event::Started { prompt_tokens }) {
            return;
        }
        let limit = self.max_tokens.unwrap_or(u32::MAX) as usize;
        let mut text = String::new();
        let mut sent = 0u32;
        for (i, piece) in tokens.into_iter().enumerate() {
            if i >= limit {
                return self.finish(FinishReason::Length, prompt_tokens, sent);
            }
            if !self.delay.is_zero() {
                thread::sleep(self.delay);
            }
            if self.cancelled_now() {
                return self.finish(FinishReason::Cancelled, prompt_tokens, sent);
            }
            if i == 1 && self.hooks.panic_worker {
                panic!("the request asked for a worker panic");
            }
            if i == 1 && self.hooks.fail {
                self.sink.send(Event::Failed(PluginError::internal(
                    "the request asked to fail",
                )));
                return;
            }
            // The text so far matters only to stop strings.
            if !self.stop.is_empty() {
                text.push_str(&piece);
                if self
                    .stop
                    .iter()
                    .any(|s| !s.is_empty() && text.contains(s.as_str()))
                {
                    return self.finish(FinishReason::Stop, prompt_tokens, sent);
                }
            }
            self.hold_kv(1);
            if !self.sink.send(token_event(i as u32, piece, self.logprobs)) {
                return; // the client is gone; whoever ran the job frees its slot
            }
            sent += 1;
        }
        self.finish(FinishReason::Stop, prompt_tokens, sent)
    }

    fn finish(&self, reason: FinishReason, prompt_tokens: u32, completion_tokens: u32) {
        self.sink.send(Event::Finished {
            reason,
            usage: Usage {
                prompt_tokens,
                completion_tokens,
            },
        });
    }
}

/// Adds the text of the next token to `tokens`: the word, after a space unless it is the
/// first, after the tag prefix when there is one.
fn push_piece(tokens: &mut Vec<String>, prefix: &str, word: &str) {
    let mut piece = String::with_capacity(1 + prefix.len() + word.len());
    if !tokens.is_empty() {
        piece.push(' ');
    }
    piece.push_str(prefix);
    piece.push_str(word);
    tokens.push(piece);
}

/// One echoed word; with log probabilities when asked: a point mass, logprob 0, no other
/// alternative with any probability.
fn token_event(id: u32, piece: String, logprobs: Option<u8>) -> Event {
    let logprobs = logprobs.map(|top| {
        let sampled = TokenLogprob {
            id,
            bytes: piece.as_bytes().to_vec().into(),
            logprob: 0.0,
        };
        TokenLogprobs {
            top: std::iter::repeat_n(sampled.clone(), top.min(1) as usize)
                .collect::<Vec<_>>()
                .into(),
            sampled,
        }
    });
    Event::Token {
        id,
        text: piece.into(),
        logprobs: logprobs.map_or(ROption::RNone, ROption::RSome),
    }
}

/// Exports a flavour of the echo plugin from a cdylib crate.
#[macro_export]
macro_rules! export_echo {
    ($flavour:expr) => {
        fn echo_manifest() -> switchyard_plugin_api::PluginManifest {
            $crate::manifest($flavour)
        }
        fn echo_create(
            kind: &str,
            settings: switchyard_plugin_api::SettingsText,
            services: switchyard_plugin_api::HostServices,
        ) -> Result<$crate::EchoModel, switchyard_plugin_api::PluginError> {
            $crate::create($flavour, kind, settings, services)
        }
        fn echo_check(
            kind: &str,
            settings: switchyard_plugin_api::SettingsText,
            config_dir: &::std::path::Path,
        ) -> Result<(), switchyard_plugin_api::PluginError> {
            $crate::check($flavour, kind, settings, config_dir)
        }
        switchyard_plugin_api::export_plugin! {
            manifest: echo_manifest,
            create: echo_create,
            check: echo_check,
        }
    };
}
