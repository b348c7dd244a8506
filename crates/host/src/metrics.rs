//! Prometheus metrics. Counters and histograms are updated as requests end and reloads finish.
//! The gauges that describe instances (in flight, queue depth, slots, adapter rows, state,
//! libraries) are not kept here: the caller reads them from the live state at scrape time into a
//! [`Snapshot`], and [`Metrics::render`] writes that snapshot out beside the counters, so a gauge
//! is never stale. This module knows nothing else of the host: every label set is a typed struct
//! below, and the label order on the wire is the field order.
//!
//! Beside the `switchyard_*` families it writes the inference gateway's model-server protocol
//! under vLLM's names, types and buckets (`vllm:*`, see `docs/operations.md`, "Metrics"), one
//! series per instance labelled [`ServedLabels`], because endpoint pickers read those by default.
//!
//! Label values are safe by construction: every text value is a [`Label`], which escapes `\\`,
//! `"` and newlines as the exposition format requires, and the callers only ever hand in names
//! from the config or the plugin manifests (a requested model name that no route knows is
//! counted as [`UNKNOWN_MODEL`]), so a client can neither forge lines nor add series.

use prometheus_client::{
    encoding::{
        text::encode, EncodeGaugeValue, EncodeLabelSet, EncodeLabelValue, EncodeMetric,
        LabelValueEncoder, MetricEncoder,
    },
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
        MetricType,
    },
    registry::Registry,
};
use std::{
    collections::HashSet,
    fmt::{Debug, Write},
    ops::AddAssign,
    sync::{Arc, Mutex},
    time::Duration,
};

/// The `model` label of a request whose requested model name matches no route or instance.
pub const UNKNOWN_MODEL: &str = "unknown";

/// A text label value, escaped as the exposition format requires when it is written.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Label(String);

impl From<&str> for Label {
    fn from(value: &str) -> Self {
        Self(value.to_string())
    }
}

impl From<String> for Label {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl EncodeLabelValue for Label {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        escape_into(&self.0, encoder)
    }
}

/// Writes `value` with `\\`, `"` and line feeds escaped (the only escapes the text format has).
fn escape_into(value: &str, out: &mut impl Write) -> std::fmt::Result {
    let mut rest = value;
    while let Some(at) = rest.find(['\\', '"', '\n']) {
        out.write_str(&rest[..at])?;
        out.write_str(match rest.as_bytes()[at] {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            _ => "\\n",
        })?;
        rest = &rest[at + 1..];
    }
    out.write_str(rest)
}

/// What served a request. Both values are empty for a request refused before admission.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServedBy {
    pub instance: Label,
    pub plugin_version: Label,
}

// The derive's `flatten` works only on a last field (prometheus-client-derive-encode 0.4), and
// these sets extend a prefix, so each spells out its fields.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    instance: Label,
    plugin_version: Label,
    model: Label,
    endpoint: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    instance: Label,
    plugin_version: Label,
    kind: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

/// The labels of every instance gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    pub instance: Label,
    pub plugin: Label,
    pub plugin_version: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdapterLabels {
    instance: Label,
    plugin: Label,
    plugin_version: Label,
    adapter: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    instance: Label,
    plugin: Label,
    plugin_version: Label,
    state: &'static str,
}

/// The labels of every `vllm:*` series: the names the instance is served under (comma-joined,
/// from the config) and the instance, so two instances behind one name stay two series.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServedLabels {
    pub model_name: Label,
    pub instance: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoraLabels {
    model_name: Label,
    instance: Label,
    max_lora: u32,
    running_lora_adapters: Label,
    waiting_lora_adapters: Label,
}

/// What `vllm:lora_requests_info` says of one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraInfo {
    pub max_lora: u32,
    /// Comma-joined adapter names.
    pub running: String,
    pub waiting: String,
    /// Unix time (seconds) of the last change of the three above.
    pub changed_at: f64,
}

/// How a request that reached an instance ended.
#[derive(Debug)]
pub struct RequestEnd<'a> {
    /// The serving instance's series.
    pub series: &'a InstanceSeries,
    pub model: &'a str,
    pub endpoint: &'static str,
    /// HTTP-like: 200, the error's status, or 499 when the client went away.
    pub status: u16,
    /// The error kind label, for a request that did not finish.
    pub error: Option<&'a str>,
    /// From admission to the end.
    pub duration: Duration,
}

/// The live state the gauges show, read at scrape time.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The current instances, then the retired ones that have not stopped yet.
    pub instances: Vec<InstanceGauges>,
    pub retired_libraries: usize,
    pub loaded_libraries: usize,
}

#[derive(Debug)]
pub struct InstanceGauges {
    pub labels: InstanceLabels,
    pub served: ServedLabels,
    /// Replaced by a reload and still stopping: shown in the `switchyard_*` gauges only, since
    /// its successor may carry the same `vllm:*` labels.
    pub retiring: bool,
    /// Fraction 0..=1 of the KV capacity in use (`vllm:kv_cache_usage_perc`).
    pub kv_usage: f64,
    /// `None` for an instance without adapters: no `vllm:lora_requests_info` series, as vLLM
    /// without LoRA.
    pub lora: Option<LoraInfo>,
    pub in_flight: u32,
    /// Admitted by the plugin and not running yet (also `vllm:num_requests_waiting`).
    pub queued: u32,
    /// In the plugin's execution batches (also `vllm:num_requests_running`).
    pub running: u32,
    pub free_slots: u32,
    /// Running rows per adapter name.
    pub adapter_rows: Vec<(String, u32)>,
    /// The lifecycle state's name (`warming`, `ready`, `draining`, `stopped`).
    pub state: &'static str,
    pub ready: bool,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The counters and histograms. Cloning shares them (one reference count: every request holds
/// a clone).
#[derive(Clone)]
pub struct Metrics(Arc<Families>);

struct Families {
    requests: Family<RequestLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    latency: HistogramFamily<ServedBy>,
    time_to_first_token: HistogramFamily<ServedBy>,
    reloads: Family<ReloadLabels, Counter>,
    vllm: VllmFamilies,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

// vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards and SLO queries written for vLLM
// read the same here.
const VLLM_TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const VLLM_TPOT_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const VLLM_E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// The per-request `vllm:*` families.
struct VllmFamilies {
    prompt_tokens: Family<ServedLabels, Counter>,
    generation_tokens: Family<ServedLabels, Counter>,
    time_to_first_token: HistogramFamily<ServedLabels>,
    time_per_output_token: HistogramFamily<ServedLabels>,
    e2e_latency: HistogramFamily<ServedLabels>,
    /// The label sets that have series in the families above (a family lists none).
    keys: Mutex<HashSet<ServedLabels>>,
}

impl VllmFamilies {
    fn new() -> Self {
        Self {
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            time_to_first_token: Family::new_with_constructor(|| Histogram::new(VLLM_TTFT_BUCKETS)),
            time_per_output_token: Family::new_with_constructor(|| {
                Histogram::new(VLLM_TPOT_BUCKETS)
            }),
            e2e_latency: Family::new_with_constructor(|| Histogram::new(VLLM_E2E_BUCKETS)),
            keys: Mutex::default(),
        }
    }
}

/// What one instance's requests write to, resolved once for its labels (see
/// [`Metrics::instance_series`]): a request then costs no label look-up, a token an atomic add
/// and a histogram observation.
#[derive(Debug)]
pub struct InstanceSeries {
    /// The `vllm:*` labels these series were resolved for.
    pub served: Arc<ServedLabels>,
    pub served_by: ServedBy,
    pub vllm: RequestSeries,
    time_to_first_token: Histogram,
    latency: Histogram,
    /// The `switchyard_requests_total` counters of this instance's finished requests (status
    /// 200), by requested model and endpoint. Every successful request counts into one: found
    /// here, it costs no label set built (three strings allocated) and hashed.
    finished: Mutex<Vec<(String, &'static str, Counter)>>,
}

impl InstanceSeries {
    /// The first token came, `after` the request arrived (`switchyard_time_to_first_token`).
    pub fn first_token(&self, after: Duration) {
        self.time_to_first_token.observe(after.as_secs_f64());
    }
}

/// One instance's `vllm:*` request series.
#[derive(Clone, Debug)]
pub struct RequestSeries {
    prompt_tokens: Counter,
    generation_tokens: Counter,
    time_to_first_token: Histogram,
    time_per_output_token: Histogram,
    e2e_latency: Histogram,
}

impl RequestSeries {
    /// The prompt went into the model (`vllm:prompt_tokens`).
    pub fn prompt(&self, tokens: u32) {
        self.prompt_tokens.inc_by(tokens.into());
    }

    /// A token came out; `after` is the time since the request arrived for the first token,
    /// and since the previous token for the others (vLLM's time per output token).
    pub fn token(&self, first: bool, after: Duration) {
        self.generation_tokens.inc();
        let histogram = if first {
            &self.time_to_first_token
        } else {
            &self.time_per_output_token
        };
        histogram.observe(after.as_secs_f64());
    }

    /// The request ended, after `duration` from its arrival.
    pub fn ended(&self, duration: Duration) {
        self.e2e_latency.observe(duration.as_secs_f64());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self(Arc::new(Families {
            requests: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            time_to_first_token: Family::new_with_constructor(latency_histogram),
            reloads: Family::default(),
            vllm: VllmFamilies::new(),
        }))
    }

    /// The series an instance's requests write to, for its labels `served` and `served_by`.
    /// Instances resolve them once and keep them (see `Instance::request_series`).
    pub fn instance_series(
        &self,
        served: Arc<ServedLabels>,
        served_by: ServedBy,
    ) -> InstanceSeries {
        let v = &self.0.vllm;
        let key = &*served;
        v.keys.lock().unwrap().insert(key.clone());
        InstanceSeries {
            vllm: RequestSeries {
                prompt_tokens: v.prompt_tokens.get_or_create(key).clone(),
                generation_tokens: v.generation_tokens.get_or_create(key).clone(),
                time_to_first_token: v.time_to_first_token.get_or_create(key).clone(),
                time_per_output_token: v.time_per_output_token.get_or_create(key).clone(),
                e2e_latency: v.e2e_latency.get_or_create(key).clone(),
            },
            time_to_first_token: self.0.time_to_first_token.get_or_create(&served_by).clone(),
            latency: self.0.latency.get_or_create(&served_by).clone(),
            finished: Mutex::default(),
            served,
            served_by,
        }
    }

    /// Drops the `vllm:*` series of every label set but `live`'s: those of instances that
    /// stopped, and of names an instance is no longer served under. An instance keeps the
    /// series it writes to (it holds them); a series dropped here is only no longer exposed.
    pub fn keep_vllm_series<'a>(&self, live: impl IntoIterator<Item = &'a ServedLabels>) {
        let live: HashSet<&ServedLabels> = live.into_iter().collect();
        let v = &self.0.vllm;
        v.keys.lock().unwrap().retain(|key| {
            if live.contains(key) {
                return true;
            }
            v.prompt_tokens.remove(key);
            v.generation_tokens.remove(key);
            v.time_to_first_token.remove(key);
            v.time_per_output_token.remove(key);
            v.e2e_latency.remove(key);
            false
        });
    }

    pub fn request_ended(&self, end: &RequestEnd<'_>) {
        end.series.latency.observe(end.duration.as_secs_f64());
        if end.status == 200 && end.error.is_none() {
            return self.count_finished(end.series, end.model, end.endpoint);
        }
        self.count(
            &end.series.served_by,
            end.model,
            end.endpoint,
            end.status,
            end.error,
        );
    }

    /// A request refused at admission: under the labels of the instance that refused it by
    /// itself (its plugin's refusal, its own cap), or under empty ones when no instance took it
    /// (bad input, unknown model, all full, ...).
    pub fn request_refused(
        &self,
        by: Option<&ServedBy>,
        model: &str,
        endpoint: &'static str,
        status: u16,
        kind: &str,
    ) {
        match by {
            Some(by) => self.count(by, model, endpoint, status, Some(kind)),
            None => self.count(&ServedBy::default(), model, endpoint, status, Some(kind)),
        }
    }

    /// [`Self::count`] for a finished request, through the instance's own counters.
    fn count_finished(&self, series: &InstanceSeries, model: &str, endpoint: &'static str) {
        let mut finished = series.finished.lock().unwrap();
        if let Some((_, _, counter)) = finished
            .iter()
            .find(|(m, e, _)| *e == endpoint && m == model)
        {
            counter.inc();
            return;
        }
        let counter = self
            .0
            .requests
            .get_or_create(&RequestLabels {
                instance: series.served_by.instance.clone(),
                plugin_version: series.served_by.plugin_version.clone(),
                model: Label::from(model),
                endpoint,
                status: 200,
            })
            .clone();
        counter.inc();
        finished.push((model.to_string(), endpoint, counter));
    }

    fn count(
        &self,
        served_by: &ServedBy,
        model: &str,
        endpoint: &'static str,
        status: u16,
        error: Option<&str>,
    ) {
        self.0
            .requests
            .get_or_create(&RequestLabels {
                instance: served_by.instance.clone(),
                plugin_version: served_by.plugin_version.clone(),
                model: Label::from(model),
                endpoint,
                status,
            })
            .inc();
        if let Some(kind) = error {
            self.0
                .errors
                .get_or_create(&ErrorLabels {
                    instance: served_by.instance.clone(),
                    plugin_version: served_by.plugin_version.clone(),
                    kind: Label::from(kind),
                })
                .inc();
        }
    }

    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.0.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// The text exposition: the `vllm:*` families, then the `switchyard_*` counters and gauges
    /// of `snapshot`.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        // A registry per scrape: the counters are shared handles, and the gauges exist only for
        // this snapshot, so two scrapes at once cannot see each other's half-written gauges.
        let mut root = Registry::default();
        self.register_vllm(&mut root, snapshot);
        let registry = root.sub_registry_with_prefix("switchyard");
        registry.register(
            "requests",
            "Requests answered, by model, instance, plugin version and status",
            self.0.requests.clone(),
        );
        registry.register(
            "request_errors",
            "Failed requests by instance and error kind",
            self.0.errors.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from admission to the last byte",
            self.0.latency.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from admission to the first token",
            self.0.time_to_first_token.clone(),
        );
        let reloads_help = "Configuration reloads by result";
        registry.register("reloads", reloads_help, self.0.reloads.clone());

        for (name, help, value, combine) in PER_INSTANCE {
            let mut family = GaugesInOrder::default();
            for i in &snapshot.instances {
                let value = i64::from(value(i));
                match combine {
                    Combine::Add => family.add(i.labels.clone(), value),
                    Combine::First => family.first(i.labels.clone(), value),
                }
            }
            registry.register(name, help, family);
        }
        let mut adapter_rows = GaugesInOrder::default();
        let mut instance_ready = GaugesInOrder::default();
        for i in &snapshot.instances {
            let InstanceLabels {
                instance,
                plugin,
                plugin_version,
            } = &i.labels;
            for (adapter, rows) in &i.adapter_rows {
                let labels = AdapterLabels {
                    instance: instance.clone(),
                    plugin: plugin.clone(),
                    plugin_version: plugin_version.clone(),
                    adapter: Label::from(adapter.as_str()),
                };
                adapter_rows.add(labels, i64::from(*rows));
            }
            let labels = StateLabels {
                instance: instance.clone(),
                plugin: plugin.clone(),
                plugin_version: plugin_version.clone(),
                state: i.state,
            };
            instance_ready.first(labels, i64::from(i.ready));
        }
        registry.register("adapter_rows", "Running rows per adapter", adapter_rows);
        let ready_help = "1 when the instance is ready, by state";
        registry.register("instance_ready", ready_help, instance_ready);

        for (name, help, value) in [
            (
                "retired_libraries",
                "Plugin libraries mapped but no longer used",
                snapshot.retired_libraries,
            ),
            (
                "loaded_libraries",
                "Plugin libraries mapped in this process",
                snapshot.loaded_libraries,
            ),
        ] {
            let gauge = Gauge::<i64>::default();
            gauge.set(value as i64);
            registry.register(name, help, gauge);
        }
        let mut out = String::with_capacity(16 * 1024);
        encode(&mut out, &root).expect("writing to a String cannot fail");
        out
    }

    /// The model-server protocol's families, under vLLM's names (no prefix: the names carry
    /// their own `vllm:`).
    fn register_vllm(&self, registry: &mut Registry, snapshot: &Snapshot) {
        let serving = || snapshot.instances.iter().filter(|i| !i.retiring);
        // Serving instances have distinct labels (their names): nothing combines here.
        let gauge = |value: fn(&InstanceGauges) -> f64| {
            let mut family = GaugesInOrder::default();
            for i in serving() {
                family.first(i.served.clone(), value(i));
            }
            family
        };
        registry.register(
            "vllm:num_requests_waiting",
            "Requests admitted and not yet running, per instance",
            gauge(|i| i.queued.into()),
        );
        registry.register(
            "vllm:num_requests_running",
            "Requests in execution batches, per instance",
            gauge(|i| i.running.into()),
        );
        registry.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage as a fraction: 1 means 100 percent",
            gauge(|i| i.kv_usage),
        );
        let mut lora = GaugesInOrder::default();
        for i in serving() {
            if let Some(info) = &i.lora {
                let labels = LoraLabels {
                    model_name: i.served.model_name.clone(),
                    instance: i.served.instance.clone(),
                    max_lora: info.max_lora,
                    running_lora_adapters: Label::from(info.running.as_str()),
                    waiting_lora_adapters: Label::from(info.waiting.as_str()),
                };
                lora.first(labels, info.changed_at);
            }
        }
        let lora_help = "Resident and waiting LoRA adapters; the value is when they last changed";
        registry.register("vllm:lora_requests_info", lora_help, lora);
        let v = &self.0.vllm;
        let prompt_help = "Prompt tokens taken into the model";
        registry.register("vllm:prompt_tokens", prompt_help, v.prompt_tokens.clone());
        registry.register(
            "vllm:generation_tokens",
            "Tokens generated",
            v.generation_tokens.clone(),
        );
        registry.register(
            "vllm:time_to_first_token_seconds",
            "Time from arrival to the first token",
            v.time_to_first_token.clone(),
        );
        registry.register(
            "vllm:time_per_output_token_seconds",
            "Time between two output tokens of a request",
            v.time_per_output_token.clone(),
        );
        registry.register(
            "vllm:e2e_request_latency_seconds",
            "Time from arrival to the end of a request",
            v.e2e_latency.clone(),
        );
    }
}

/// A gauge family built for one scrape, written in the order its series were added: the
/// snapshot's, which is the configuration's, then the retired instances'. A `Family` writes its
/// series in hash-map order, which changes from scrape to scrape, and an endpoint picker that
/// takes the first series of a name (one model name served by two instances) would then read a
/// different instance each time. A label set can come twice: an instance reloaded with the same
/// plugin version, still draining beside its successor. Its counts then show what both hold
/// ([`Self::add`]), and its capacity and state the successor's ([`Self::first`]).
#[derive(Debug)]
struct GaugesInOrder<L, N>(Vec<(L, N)>);

impl<L, N> Default for GaugesInOrder<L, N> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<L: PartialEq, N: AddAssign> GaugesInOrder<L, N> {
    /// A count: added to what the label set holds already.
    fn add(&mut self, labels: L, value: N) {
        match self.0.iter_mut().find(|(l, _)| *l == labels) {
            Some((_, sum)) => *sum += value,
            None => self.0.push((labels, value)),
        }
    }

    /// A capacity or a state: the first value of a label set stands (the current instance's,
    /// which the snapshot lists before the retired ones).
    fn first(&mut self, labels: L, value: N) {
        if !self.0.iter().any(|(l, _)| *l == labels) {
            self.0.push((labels, value));
        }
    }
}

impl<L, N> EncodeMetric for GaugesInOrder<L, N>
where
    L: EncodeLabelSet + Debug,
    N: EncodeGaugeValue + Debug,
{
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, value) in &self.0 {
            encoder.encode_family(labels)?.encode_gauge(value)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// How two instances with one label set combine in a gauge (see [`GaugesInOrder`]).
#[derive(Clone, Copy)]
enum Combine {
    Add,
    First,
}

/// A gauge with one value per instance: name, help, the value, and how it combines.
type PerInstanceGauge = (
    &'static str,
    &'static str,
    fn(&InstanceGauges) -> u32,
    Combine,
);

const PER_INSTANCE: [PerInstanceGauge; 4] = [
    (
        "in_flight",
        "Requests admitted and not finished, per instance and plugin version",
        |i| i.in_flight,
        Combine::Add,
    ),
    (
        "queue_depth",
        "Requests queued inside the plugin",
        |i| i.queued,
        Combine::Add,
    ),
    (
        "running",
        "Requests being computed inside the plugin",
        |i| i.running,
        Combine::Add,
    ),
    (
        "free_slots",
        "Slots free inside the plugin",
        |i| i.free_slots,
        Combine::First,
    ),
];

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The labels of an instance `a` serving `chat`, for the tests here and of the request's
    /// record.
    pub(crate) fn served() -> ServedLabels {
        ServedLabels {
            model_name: "chat".into(),
            instance: "a".into(),
        }
    }

    pub(crate) fn served_by() -> ServedBy {
        ServedBy {
            instance: "a".into(),
            plugin_version: "1.0.0".into(),
        }
    }

    #[test]
    fn labels_keep_their_wire_order_and_refusals_have_no_instance() {
        let metrics = Metrics::new();
        let series = metrics.instance_series(Arc::new(served()), served_by());
        metrics.request_ended(&RequestEnd {
            series: &series,
            model: "chat",
            endpoint: "chat",
            status: 499,
            error: Some("client_closed"),
            duration: Duration::from_millis(3),
        });
        metrics.request_refused(None, "", "transcription", 400, "invalid_request");
        metrics.reload(false);
        let text = metrics.render(&Snapshot::default());
        for line in [
            r#"switchyard_requests_total{instance="a",plugin_version="1.0.0",model="chat",endpoint="chat",status="499"} 1"#,
            r#"switchyard_request_errors_total{instance="a",plugin_version="1.0.0",kind="client_closed"} 1"#,
            r#"switchyard_request_duration_seconds_count{instance="a",plugin_version="1.0.0"} 1"#,
            r#"switchyard_requests_total{instance="",plugin_version="",model="",endpoint="transcription",status="400"} 1"#,
            r#"switchyard_request_errors_total{instance="",plugin_version="",kind="invalid_request"} 1"#,
            r#"switchyard_reloads_total{result="failed"} 1"#,
            "switchyard_retired_libraries 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        // A refusal observes no latency: only the admitted request has a duration.
        assert_eq!(
            text.matches("switchyard_request_duration_seconds_count")
                .count(),
            1
        );
    }

    #[test]
    fn label_values_are_escaped_so_no_line_can_be_forged() {
        let metrics = Metrics::new();
        let hostile = "a\"} 1\nforged_total 9\n\\";
        let served_by = ServedBy {
            instance: hostile.into(),
            plugin_version: "1".into(),
        };
        let series = metrics.instance_series(Arc::new(served()), served_by);
        metrics.request_ended(&RequestEnd {
            series: &series,
            model: hostile,
            endpoint: "chat",
            status: 200,
            error: None,
            duration: Duration::from_millis(1),
        });
        let text = metrics.render(&Snapshot::default());
        assert!(
            !text.lines().any(|l| l.starts_with("forged_total")),
            "{text}"
        );
        let escaped = r#"a\"} 1\nforged_total 9\n\\"#;
        assert!(
            text.contains(&format!(
                r#"instance="{escaped}",plugin_version="1",model="{escaped}""#
            )),
            "{text}"
        );
    }

    #[test]
    fn gauges_show_the_snapshot_and_only_it() {
        let metrics = Metrics::new();
        let labels = InstanceLabels {
            instance: "a".into(),
            plugin: "echo".into(),
            plugin_version: "1.0.0".into(),
        };
        let snapshot = Snapshot {
            instances: vec![InstanceGauges {
                labels,
                served: ServedLabels {
                    model_name: "chat".into(),
                    instance: "a".into(),
                },
                retiring: false,
                kv_usage: 0.25,
                lora: None,
                in_flight: 3,
                queued: 2,
                running: 1,
                free_slots: 4,
                adapter_rows: vec![("speech".into(), 1)],
                state: "draining",
                ready: false,
            }],
            retired_libraries: 1,
            loaded_libraries: 2,
        };
        let text = metrics.render(&snapshot);
        let of = r#"instance="a",plugin="echo",plugin_version="1.0.0""#;
        for line in [
            format!("switchyard_in_flight{{{of}}} 3"),
            format!("switchyard_queue_depth{{{of}}} 2"),
            format!("switchyard_running{{{of}}} 1"),
            format!("switchyard_free_slots{{{of}}} 4"),
            format!("switchyard_adapter_rows{{{of},adapter=\"speech\"}} 1"),
            format!("switchyard_instance_ready{{{of},state=\"draining\"}} 0"),
            "switchyard_retired_libraries 1".into(),
            "switchyard_loaded_libraries 2".into(),
        ] {
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
        // The next scrape shows the next snapshot, not a leftover of this one.
        let text = metrics.render(&Snapshot::default());
        assert!(!text.contains("switchyard_in_flight{"), "{text}");
    }

    fn gauges(
        instance: &str,
        names: &str,
        retiring: bool,
        lora: Option<LoraInfo>,
    ) -> InstanceGauges {
        InstanceGauges {
            labels: InstanceLabels {
                instance: instance.into(),
                plugin: "echo".into(),
                plugin_version: "1.0.0".into(),
            },
            served: ServedLabels {
                model_name: names.into(),
                instance: instance.into(),
            },
            retiring,
            kv_usage: 0.5,
            lora,
            in_flight: 3,
            queued: 2,
            running: 1,
            free_slots: 0,
            adapter_rows: Vec::new(),
            state: "ready",
            ready: true,
        }
    }

    #[test]
    fn gauge_series_come_in_the_snapshots_order_and_a_repeated_label_set_combines() {
        let metrics = Metrics::new();
        // Names whose hash-map order differs from this one in most scrapes.
        let names = ["zeta", "alpha", "mid", "beta", "omega", "delta"];
        let mut instances: Vec<_> = names.iter().map(|n| gauges(n, n, false, None)).collect();
        // A retired instance with the current one's labels (reloaded, same version).
        let mut retired = gauges("alpha", "alpha", true, None);
        retired.free_slots = 5;
        instances.push(retired);
        let snapshot = Snapshot {
            instances,
            ..Snapshot::default()
        };
        for _ in 0..8 {
            let text = metrics.render(&snapshot);
            for family in ["vllm:num_requests_waiting{", "switchyard_in_flight{"] {
                let order: Vec<&str> = text
                    .lines()
                    .filter(|l| l.starts_with(family))
                    .map(|l| {
                        l.split("instance=\"")
                            .nth(1)
                            .unwrap()
                            .split('"')
                            .next()
                            .unwrap()
                    })
                    .collect();
                assert_eq!(order, names, "{family} in:\n{text}");
            }
            // Its requests count with its successor's; its free slots are not the successor's.
            let of = r#"instance="alpha",plugin="echo",plugin_version="1.0.0""#;
            for line in [
                format!("switchyard_in_flight{{{of}}} 6"),
                format!("switchyard_free_slots{{{of}}} 0"),
                format!("switchyard_instance_ready{{{of},state=\"ready\"}} 1"),
            ] {
                assert!(text.contains(&line), "{line} missing from:\n{text}");
            }
        }
    }

    #[test]
    fn vllm_families_have_vllm_names_types_and_one_series_per_serving_instance() {
        let metrics = Metrics::new();
        let served = ServedLabels {
            model_name: "chat,assistant".into(),
            instance: "a".into(),
        };
        let series = metrics.instance_series(Arc::new(served), served_by()).vllm;
        series.prompt(7);
        series.token(true, Duration::from_millis(30));
        series.token(false, Duration::from_millis(60));
        series.ended(Duration::from_millis(400));
        let lora = LoraInfo {
            max_lora: 2,
            running: "speech,vision".into(),
            waiting: String::new(),
            changed_at: 1_700_000_000.5,
        };
        let snapshot = Snapshot {
            instances: vec![
                gauges("a", "chat,assistant", false, Some(lora)),
                // The instance a reload replaced (the previous plugin version): same served
                // labels, not shown in `vllm:*`.
                InstanceGauges {
                    labels: InstanceLabels {
                        plugin_version: "0.9.0".into(),
                        ..gauges("a", "", true, None).labels
                    },
                    ..gauges("a", "chat,assistant", true, None)
                },
            ],
            ..Snapshot::default()
        };
        let text = metrics.render(&snapshot);
        let of = r#"model_name="chat,assistant",instance="a""#;
        for line in [
            "# TYPE vllm:num_requests_waiting gauge".to_string(),
            format!("vllm:num_requests_waiting{{{of}}} 2.0"),
            format!("vllm:num_requests_running{{{of}}} 1.0"),
            format!("vllm:kv_cache_usage_perc{{{of}}} 0.5"),
            "# TYPE vllm:lora_requests_info gauge".into(),
            format!(
                "vllm:lora_requests_info{{{of},max_lora=\"2\",running_lora_adapters=\"speech,vision\",waiting_lora_adapters=\"\"}} 1700000000.5"
            ),
            "# TYPE vllm:prompt_tokens counter".into(),
            format!("vllm:prompt_tokens_total{{{of}}} 7"),
            format!("vllm:generation_tokens_total{{{of}}} 2"),
            "# TYPE vllm:time_to_first_token_seconds histogram".into(),
            format!("vllm:time_to_first_token_seconds_bucket{{le=\"0.04\",{of}}} 1"),
            format!("vllm:time_to_first_token_seconds_bucket{{le=\"0.02\",{of}}} 0"),
            format!("vllm:time_per_output_token_seconds_bucket{{le=\"0.075\",{of}}} 1"),
            format!("vllm:time_per_output_token_seconds_bucket{{le=\"0.05\",{of}}} 0"),
            format!("vllm:e2e_request_latency_seconds_bucket{{le=\"0.5\",{of}}} 1"),
            format!("vllm:e2e_request_latency_seconds_bucket{{le=\"0.3\",{of}}} 0"),
            format!("vllm:e2e_request_latency_seconds_count{{{of}}} 1"),
        ] {
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
        assert_eq!(
            text.matches("vllm:num_requests_waiting{").count(),
            1,
            "{text}"
        );
        // The retiring instance still shows in the host's own gauges.
        assert_eq!(text.matches("switchyard_in_flight{").count(), 2, "{text}");
    }
}
