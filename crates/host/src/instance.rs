//! One model instance: a plugin's model object plus the host's bookkeeping (lifecycle state,
//! admission limit, in-flight count). Requests hold an [`Admission`] for as long as they run, and
//! draining waits for those to end.

use crate::{
    config::{ModelConfig, RequestLimits, ServerConfig},
    metrics::{InstanceSeries, LoraInfo, Metrics, ServedBy, ServedLabels},
    registry::LoadedPlugin,
    sink::{self, EventReceiver, SinkLimits},
};
use abi_stable::std_types::{ROption, RResult};
use arc_swap::{ArcSwap, ArcSwapOption};
use axum::http::HeaderValue;
use serde::Serialize;
use std::{
    sync::{
        atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering},
        Arc, Mutex, OnceLock, RwLock,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};
use switchyard_plugin_api::{
    ApiVersion, Endpoint, Modality, ModelBox, ModelKindInfo, ModelResources, ModelStats, Part,
    PluginError, Prompt, Request,
};
use tokio::sync::Notify;

/// What the host enforces for one instance: the operator caps on a request, and the bound of
/// each request's event channel.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceLimits {
    pub request: RequestLimits,
    pub sink: SinkLimits,
}

impl InstanceLimits {
    pub fn of(model: &ModelConfig, server: &ServerConfig) -> Self {
        Self {
            request: RequestLimits::resolve(&model.limits, &server.limits),
            sink: SinkLimits {
                capacity: server.event_buffer,
                send_timeout: Duration::from_secs_f64(server.event_send_timeout_secs),
            },
        }
    }
}

/// What an instance is asked to serve: a request, and for a completion its raw prompt (the
/// request's messages are then empty).
#[derive(Debug, Clone)]
pub struct Submission {
    pub request: Request,
    /// `Some` for `/v1/completions`: the plugin's `submit_prompt` (API 2.1) takes it.
    pub prompt: Option<Prompt>,
    /// The field the client set `request.sampling.max_tokens` with, for refusals to name:
    /// `max_tokens`, or chat's `max_completion_tokens`.
    pub max_tokens_field: &'static str,
}

impl Submission {
    /// The endpoint's name in metrics and errors.
    pub fn endpoint_name(&self) -> &'static str {
        match self.prompt {
            Some(_) => COMPLETIONS,
            None => endpoint_name(self.request.endpoint),
        }
    }
}

impl From<Request> for Submission {
    fn from(request: Request) -> Self {
        Self {
            request,
            prompt: None,
            max_tokens_field: "max_tokens",
        }
    }
}

/// The name of `/v1/completions` in metrics and errors. It is no [`Endpoint`]: completions are
/// routed as text chats, and the plugin takes them through `submit_prompt`.
pub const COMPLETIONS: &str = "completions";

/// A request over an operator cap: the request field at fault and the message naming the cap.
#[derive(Debug)]
pub struct OverCap {
    pub param: &'static str,
    pub message: String,
}

impl RequestLimits {
    /// Refuses a request over a cap, naming it; fills in the default `max_tokens`.
    pub fn apply(&self, submission: &mut Submission) -> Result<(), OverCap> {
        let over = |param, message| Err(OverCap { param, message });
        // A completion's text is its prompt, and a transcription's (its form field); a chat's,
        // its messages.
        let text_field = if submission.prompt.is_some()
            || submission.request.endpoint == Endpoint::Transcription
        {
            "prompt"
        } else {
            "messages"
        };
        let request = &mut submission.request;
        match request.sampling.max_tokens {
            ROption::RSome(asked) if asked > self.max_tokens_limit => {
                let field = submission.max_tokens_field;
                return over(
                    field,
                    format!(
                        "{field} {asked} exceeds this model's limit max_tokens_limit = {}",
                        self.max_tokens_limit
                    ),
                );
            }
            ROption::RSome(_) => {}
            // A transcription's length is its clip's, which no client states: it gets the cap
            // as its bound, and the model sizes the budget from the clip within it. (The
            // default, 256 tokens unless set, cut a few minutes of speech short.)
            ROption::RNone if request.endpoint == Endpoint::Transcription => {
                request.sampling.max_tokens = ROption::RSome(self.max_tokens_limit);
            }
            ROption::RNone => {
                if let Some(default) = self.default_max_tokens {
                    request.sampling.max_tokens = ROption::RSome(default);
                }
            }
        }
        // A message with no content counts as one part: it still costs the model its role's
        // tokens, and counted as none, any number of them passed the cap.
        let parts: usize = request.messages.iter().map(|m| m.parts.len().max(1)).sum();
        if parts > self.max_content_parts {
            return over(
                "messages",
                format!(
                    "the request has {parts} content parts (a message without content counts \
                     as one), over this model's limit max_content_parts = {}",
                    self.max_content_parts
                ),
            );
        }
        let text_bytes: usize = request
            .messages
            .iter()
            .flat_map(|m| m.parts.iter())
            .map(|p| match p {
                switchyard_plugin_api::Part::Text(text) => text.len(),
                _ => 0,
            })
            .sum::<usize>()
            + submission.prompt.as_ref().map_or(0, Prompt::weight_bytes);
        if text_bytes > self.max_prompt_bytes {
            return over(
                text_field,
                format!(
                    "the prompt has {text_bytes} bytes (its text, and 4 per token id), over \
                     this model's limit max_prompt_bytes = {}",
                    self.max_prompt_bytes
                ),
            );
        }
        if request.stop.len() > self.max_stop_sequences {
            return over(
                "stop",
                format!(
                    "{} stop sequences exceed this model's limit max_stop_sequences = {}",
                    request.stop.len(),
                    self.max_stop_sequences
                ),
            );
        }
        if let Some(long) = request.stop.iter().find(|s| s.len() > self.max_stop_bytes) {
            return over(
                "stop",
                format!(
                    "a stop sequence of {} bytes exceeds this model's limit max_stop_bytes = {}",
                    long.len(),
                    self.max_stop_bytes
                ),
            );
        }
        Ok(())
    }
}

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    Warming = 0,
    Ready = 1,
    Draining = 2,
    Stopped = 3,
}

impl InstanceState {
    /// As in `/ready`, `/admin/status` and the `state` metric label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Warming => "warming",
            Self::Ready => "ready",
            Self::Draining => "draining",
            Self::Stopped => "stopped",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Warming,
            1 => Self::Ready,
            2 => Self::Draining,
            _ => Self::Stopped,
        }
    }
}

pub struct Instance {
    pub name: String,
    pub plugin: Arc<LoadedPlugin>,
    pub kind: ModelKindInfo,
    pub max_in_flight: u32,
    pub limits: InstanceLimits,
    /// What the instance was created from; a reload reuses an instance with the same fingerprint.
    pub fingerprint: String,
    model: RwLock<Option<ModelBox>>,
    state: AtomicU8,
    in_flight: AtomicU32,
    served: AtomicU64,
    idle: Notify,
    pub created: Instant,
    /// The labels of its `vllm:*` series; the deployment that uses it sets them (a reload that
    /// reuses it may serve it under other names).
    served_labels: ArcSwap<ServedLabels>,
    /// What `vllm:lora_requests_info` last showed, with the time it changed.
    lora: Mutex<Option<LoraInfo>>,
    /// What [`Instance::request_series`] resolved last, for the served labels it holds.
    request_series: ArcSwapOption<InstanceSeries>,
    /// The `x-switchyard-instance` and `x-switchyard-plugin` values of its responses, built
    /// once (`None` where a name is not a valid header value).
    served_by_headers: OnceLock<[Option<HeaderValue>; 2]>,
}

/// Why an instance did not take a request.
#[derive(Debug)]
pub enum Refusal {
    /// The instance does not serve this endpoint/modality; `part` is the first medium it cannot
    /// take (message, part), which the error names as its `param`.
    Unsupported {
        message: String,
        part: Option<(usize, usize)>,
    },
    /// Full (host admission limit or the plugin's queue): try a fallback, else 429.
    Full(String),
    /// Draining or stopped: try a fallback, else 503.
    Unavailable(String),
    /// The plugin refused the request itself (bad input, panic, ...): no fallback.
    Failed(PluginError),
    /// Over one of the instance's operator caps: no fallback (HTTP 400 naming the field).
    OverCap(OverCap),
}

/// The first image or audio part (message, part) whose modality the model does not take even
/// with text alone (`accepts`); `None` when each kind is taken alone and only their mix is not.
fn first_refused_medium(
    request: &Request,
    accepts: impl Fn(Modality) -> bool,
) -> Option<(usize, usize)> {
    request
        .messages
        .iter()
        .enumerate()
        .find_map(|(i, message)| {
            message.parts.iter().enumerate().find_map(|(j, part)| {
                let alone = match part {
                    Part::Image(_) => Modality::Image,
                    Part::Audio { .. } => Modality::Audio,
                    Part::Text(_) => return None,
                };
                (!accepts(alone)).then_some((i, j))
            })
        })
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unsupported { message: m, .. }
            | Refusal::Full(m)
            | Refusal::Unavailable(m) => f.write_str(m),
            Refusal::Failed(e) => f.write_str(&e.message),
            Refusal::OverCap(c) => write!(f, "{}: {}", c.param, c.message),
        }
    }
}

/// A request admitted into an instance. Dropping it before the request finished cancels the
/// request inside the plugin (client gone), and always releases the admission slot.
pub struct Admission {
    instance: Arc<Instance>,
    request_id: u64,
    finished: bool,
}

impl Admission {
    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }
    pub fn request_id(&self) -> u64 {
        self.request_id
    }
    /// The request reached a terminal event; dropping no longer cancels.
    pub fn mark_finished(&mut self) {
        self.finished = true;
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if !self.finished {
            self.instance.cancel(self.request_id);
        }
        self.instance.served.fetch_add(1, Ordering::Relaxed);
        if self.instance.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.instance.idle.notify_waiters();
        }
    }
}

impl Instance {
    pub fn new(
        config: &ModelConfig,
        plugin: Arc<LoadedPlugin>,
        kind: ModelKindInfo,
        model: ModelBox,
        limits: InstanceLimits,
    ) -> Self {
        Self {
            name: config.name.clone(),
            kind,
            max_in_flight: config.max_in_flight,
            fingerprint: fingerprint(config, &plugin.sha256, &limits),
            limits,
            plugin,
            model: RwLock::new(Some(model)),
            state: AtomicU8::new(InstanceState::Warming as u8),
            in_flight: AtomicU32::new(0),
            served: AtomicU64::new(0),
            idle: Notify::new(),
            created: Instant::now(),
            served_labels: ArcSwap::from_pointee(ServedLabels {
                model_name: config.name.as_str().into(),
                instance: config.name.as_str().into(),
            }),
            lora: Mutex::new(None),
            request_series: ArcSwapOption::empty(),
            served_by_headers: OnceLock::new(),
        }
    }

    pub fn served_labels(&self) -> Arc<ServedLabels> {
        self.served_labels.load_full()
    }

    /// The series this instance's requests write to, resolved in `metrics` once per set of
    /// served names (they change only on a reload), not per request.
    pub fn request_series(&self, metrics: &Metrics) -> Arc<InstanceSeries> {
        let served = self.served_labels.load();
        if let Some(cached) = &*self.request_series.load() {
            if Arc::ptr_eq(&cached.served, &*served) {
                return cached.clone();
            }
        }
        let served_by = ServedBy {
            instance: self.name.as_str().into(),
            plugin_version: self.plugin.version().to_string().into(),
        };
        let series = Arc::new(metrics.instance_series(Arc::clone(&*served), served_by));
        self.request_series.store(Some(series.clone()));
        series
    }

    /// Serves this instance under `names` (see `ValidConfig::served_names`).
    pub fn set_served_names(&self, names: String) {
        self.served_labels.store(Arc::new(ServedLabels {
            model_name: names.into(),
            instance: self.name.as_str().into(),
        }));
    }

    pub fn state(&self) -> InstanceState {
        InstanceState::from_u8(self.state.load(Ordering::Acquire))
    }

    fn set_state(&self, state: InstanceState) {
        self.state.store(state as u8, Ordering::Release);
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    pub fn plugin_label(&self) -> String {
        self.plugin.label()
    }

    /// The header values that name this instance and its plugin version on a response; `None`
    /// for a name that is no valid header value.
    pub fn served_by_headers(&self) -> &[Option<HeaderValue>; 2] {
        self.served_by_headers.get_or_init(|| {
            [
                HeaderValue::try_from(self.name.as_str()).ok(),
                HeaderValue::try_from(self.plugin_label()).ok(),
            ]
        })
    }

    /// Runs the plugin's warm-up; on success the instance is ready. Blocking.
    pub fn warm(&self) -> Result<(), PluginError> {
        let result = match &*self.model.read().unwrap() {
            Some(model) => model.warm(),
            None => RResult::RErr(PluginError::unavailable("instance is stopped")),
        };
        match result {
            RResult::ROk(()) => {
                self.set_state(InstanceState::Ready);
                Ok(())
            }
            RResult::RErr(e) => Err(e),
        }
    }

    /// Admits and submits a request (within this instance's caps, which may fill in its
    /// `max_tokens`). Events arrive on the returned receiver.
    pub fn submit(
        self: &Arc<Self>,
        mut submission: Submission,
    ) -> Result<(Admission, EventReceiver), Refusal> {
        let request = &submission.request;
        let modality = request.modality();
        if !self.kind.accepts(request.endpoint, modality) {
            return Err(Refusal::Unsupported {
                message: format!(
                    "model {} does not serve {modality} requests on the {} endpoint",
                    self.name,
                    submission.endpoint_name()
                ),
                part: first_refused_medium(request, |alone| {
                    self.kind.accepts(request.endpoint, alone)
                }),
            });
        }
        let api = self.plugin.manifest.api_version;
        // A 2.0 plugin's export glue does not look for a prompt in the request.
        if submission.prompt.is_some() && !api.accepts(RAW_PROMPTS) {
            return Err(Refusal::Unsupported {
                message: format!(
                    "model {} does not serve the completions endpoint: its plugin {} was built \
                     against plugin API {api}, and raw prompts need {RAW_PROMPTS}",
                    self.name,
                    self.plugin_label()
                ),
                part: None,
            });
        }
        if self.state() != InstanceState::Ready {
            return Err(Refusal::Unavailable(format!(
                "model {} is {:?}",
                self.name,
                self.state()
            )));
        }
        self.limits
            .request
            .apply(&mut submission)
            .map_err(Refusal::OverCap)?;
        let Submission {
            request, prompt, ..
        } = submission;
        let request = match &prompt {
            None => request,
            Some(prompt) => request
                .with_prompt(prompt)
                .map_err(|message| Refusal::Failed(PluginError::invalid_request(message)))?,
        };
        // Admission: reserve a slot first, give it back if over the limit.
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let mut admission = Admission {
            instance: self.clone(),
            request_id: request.id,
            finished: true,
        };
        if before >= self.max_in_flight {
            return Err(Refusal::Full(format!(
                "model {} has {} requests in flight (max_in_flight {})",
                self.name, before, self.max_in_flight
            )));
        }
        // A drain may have begun between the state check and the reservation; the drain counts
        // in-flight requests after it flips the state, so re-checking here closes the gap.
        if self.state() != InstanceState::Ready {
            return Err(Refusal::Unavailable(format!(
                "model {} is {:?}",
                self.name,
                self.state()
            )));
        }
        let (sink, rx) = sink::channel(self.limits.sink.clone());
        let guard = self.model.read().unwrap();
        let Some(model) = guard.as_ref() else {
            return Err(Refusal::Unavailable(format!(
                "model {} is stopped",
                self.name
            )));
        };
        match model.submit(request, sink) {
            RResult::ROk(()) => {
                admission.finished = false;
                Ok((admission, rx))
            }
            RResult::RErr(e) => Err(match e.kind {
                switchyard_plugin_api::ErrorKind::Overloaded => {
                    Refusal::Full(e.message.to_string())
                }
                switchyard_plugin_api::ErrorKind::Unavailable => {
                    Refusal::Unavailable(e.message.to_string())
                }
                _ => Refusal::Failed(e),
            }),
        }
    }

    pub fn cancel(&self, request_id: u64) -> bool {
        match &*self.model.read().unwrap() {
            Some(model) => model.cancel(request_id),
            None => false,
        }
    }

    pub fn stats(&self) -> ModelStats {
        match &*self.model.read().unwrap() {
            Some(model) => model.stats(),
            None => ModelStats {
                details_json: "{}".into(),
                ..Default::default()
            },
        }
    }

    /// `vllm:lora_requests_info` for `resources`: `None` without adapters; else the adapters,
    /// stamped with the Unix time they last changed (the first scrape that saw them so).
    pub fn lora_info(&self, resources: &ModelResources) -> Option<LoraInfo> {
        if resources.max_adapters == 0 && resources.resident_adapters.is_empty() {
            return None;
        }
        let mut now = LoraInfo {
            max_lora: resources.max_adapters,
            running: resources.resident_adapters.join(","),
            waiting: resources.waiting_adapters.join(","),
            changed_at: 0.0,
        };
        let mut last = self.lora.lock().unwrap();
        let unchanged = last
            .as_ref()
            .filter(|seen| {
                (seen.max_lora, &seen.running, &seen.waiting)
                    == (now.max_lora, &now.running, &now.waiting)
            })
            .map(|seen| seen.changed_at);
        match unchanged {
            Some(at) => now.changed_at = at,
            None => {
                now.changed_at = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                *last = Some(now.clone());
            }
        }
        Some(now)
    }

    /// Stops admissions, waits for in-flight requests up to `deadline`, shuts the model down and
    /// drops it (freeing its memory; the library stays mapped). Returns the requests that were
    /// still running at the deadline (and were cancelled by the shutdown).
    pub async fn drain_and_stop(self: Arc<Self>, deadline: Duration) -> u32 {
        self.set_state(InstanceState::Draining);
        if let Some(model) = &*self.model.read().unwrap() {
            model.drain();
        }
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                break;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                break;
            }
        }
        let left = self.in_flight();
        let this = self.clone();
        let _ = tokio::task::spawn_blocking(move || this.stop_now()).await;
        left
    }

    /// Shuts the model down and drops it. Blocking.
    pub fn stop_now(&self) {
        let model = self.model.write().unwrap().take();
        if let Some(model) = model {
            model.shutdown();
            drop(model);
        }
        self.set_state(InstanceState::Stopped);
    }

    pub fn serves(&self, endpoint: Endpoint, modality: Modality) -> bool {
        self.kind.accepts(endpoint, modality)
    }
}

/// The first plugin API whose export glue hands a prompt to `PluginModel::submit_prompt`.
const RAW_PROMPTS: ApiVersion = ApiVersion { major: 2, minor: 1 };

pub fn endpoint_name(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "chat",
        Endpoint::Transcription => "transcription",
    }
}

/// Instances are reused across a reload only when everything they were created from is equal.
pub fn fingerprint(config: &ModelConfig, plugin_sha: &str, limits: &InstanceLimits) -> String {
    format!(
        "{}|{}|{}|{}|{:?}|{}|{:?}",
        config.plugin,
        plugin_sha,
        config.kind,
        config.settings,
        config.threads,
        config.max_in_flight,
        limits
    )
}

#[cfg(test)]
mod tests {
    use super::InstanceState;

    #[test]
    fn state_names_are_the_json_names() {
        for state in [
            InstanceState::Warming,
            InstanceState::Ready,
            InstanceState::Draining,
            InstanceState::Stopped,
        ] {
            let json = serde_json::to_value(state).unwrap();
            assert_eq!(json.as_str(), Some(state.name()));
        }
    }
}
