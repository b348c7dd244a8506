//! Prometheus metrics. Counters and histograms are updated as requests finish; the gauges that
//! describe instances (in flight, queue depth, slots, adapter rows, libraries) are read from the
//! live state at scrape time, so they are never stale.

use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};

pub type Labels = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    pub requests: Family<Labels, Counter>,
    pub errors: Family<Labels, Counter>,
    pub latency: HistogramFamily,
    pub time_to_first_token: HistogramFamily,
    pub reloads: Family<Labels, Counter>,
    pub in_flight: Family<Labels, Gauge>,
    pub queue_depth: Family<Labels, Gauge>,
    pub running: Family<Labels, Gauge>,
    pub free_slots: Family<Labels, Gauge>,
    pub adapter_rows: Family<Labels, Gauge>,
    pub instance_ready: Family<Labels, Gauge>,
    pub retired_libraries: Gauge,
    pub loaded_libraries: Gauge,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard");
        let m = Self {
            requests: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            time_to_first_token: Family::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            ),
            reloads: Family::default(),
            in_flight: Family::default(),
            queue_depth: Family::default(),
            running: Family::default(),
            free_slots: Family::default(),
            adapter_rows: Family::default(),
            instance_ready: Family::default(),
            retired_libraries: Gauge::default(),
            loaded_libraries: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "Requests answered, by model, instance, plugin version and status",
            m.requests.clone(),
        );
        registry.register(
            "request_errors",
            "Failed requests by instance and error kind",
            m.errors.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from admission to the last byte",
            m.latency.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from admission to the first token",
            m.time_to_first_token.clone(),
        );
        registry.register(
            "reloads",
            "Configuration reloads by result",
            m.reloads.clone(),
        );
        registry.register(
            "in_flight",
            "Requests admitted and not finished, per instance and plugin version",
            m.in_flight.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests queued inside the plugin",
            m.queue_depth.clone(),
        );
        registry.register(
            "running",
            "Requests being computed inside the plugin",
            m.running.clone(),
        );
        registry.register(
            "free_slots",
            "Slots free inside the plugin",
            m.free_slots.clone(),
        );
        registry.register(
            "adapter_rows",
            "Running rows per adapter",
            m.adapter_rows.clone(),
        );
        registry.register(
            "instance_ready",
            "1 when the instance is ready, by state",
            m.instance_ready.clone(),
        );
        registry.register(
            "retired_libraries",
            "Plugin libraries mapped but no longer used",
            m.retired_libraries.clone(),
        );
        registry.register(
            "loaded_libraries",
            "Plugin libraries mapped in this process",
            m.loaded_libraries.clone(),
        );
        Self { registry, ..m }
    }

    /// Refreshes the live gauges from `runtime` and renders the text exposition.
    pub fn render(&self, runtime: &crate::runtime::Runtime) -> String {
        for family in [
            &self.in_flight,
            &self.queue_depth,
            &self.running,
            &self.free_slots,
            &self.adapter_rows,
            &self.instance_ready,
        ] {
            family.clear();
        }
        let generation = runtime.current();
        let live = generation.instances().cloned();
        let retiring = runtime
            .retired_instances()
            .into_iter()
            .filter(|i| i.state() != crate::instance::InstanceState::Stopped);
        for instance in live.chain(retiring) {
            let labels: Labels = vec![
                ("instance".into(), instance.name.clone()),
                ("plugin".into(), instance.plugin.manifest.name.to_string()),
                (
                    "plugin_version".into(),
                    instance.plugin.version().to_string(),
                ),
            ];
            let stats = instance.stats();
            self.in_flight
                .get_or_create(&labels)
                .set(instance.in_flight() as i64);
            self.queue_depth
                .get_or_create(&labels)
                .set(stats.queued as i64);
            self.running
                .get_or_create(&labels)
                .set(stats.running as i64);
            self.free_slots
                .get_or_create(&labels)
                .set(stats.free_slots as i64);
            for adapter in stats.adapters.iter() {
                let mut l = labels.clone();
                l.push(("adapter".into(), adapter.adapter.to_string()));
                self.adapter_rows.get_or_create(&l).set(adapter.rows as i64);
            }
            let mut l = labels.clone();
            l.push((
                "state".into(),
                format!("{:?}", instance.state()).to_lowercase(),
            ));
            self.instance_ready
                .get_or_create(&l)
                .set((instance.state() == crate::instance::InstanceState::Ready) as i64);
        }
        self.retired_libraries
            .set(runtime.retired_libraries() as i64);
        self.loaded_libraries
            .set(runtime.registry().loaded_count() as i64);
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
