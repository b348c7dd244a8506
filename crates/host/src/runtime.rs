//! The serving state: the current [`Deployment`] behind `arc-swap`, so a request resolves
//! without locks, plus what outlives deployments (the plugin registry, the instances retired by
//! reloads, the metrics, request ids). How the next deployment is built and swapped in is in
//! `crate::reload`.

use crate::{
    config::{self, ValidConfig},
    deployment::Deployment,
    instance::{Instance, InstanceState},
    metrics::{self, Metrics},
    registry::Registry,
};
use arc_swap::ArcSwap;
use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use switchyard_plugin_api::{ModelResources, ModelStats};

pub struct Runtime {
    current: ArcSwap<Deployment>,
    registry: Registry,
    /// Reloads run one at a time.
    reload_lock: tokio::sync::Mutex<()>,
    next_generation: AtomicU64,
    next_request: AtomicU64,
    /// Random per process, in hex: the response ids' prefix, so that ids differ across
    /// restarts and replicas, while the request ids the plugins see stay small counters.
    response_id_prefix: String,
    /// Instances retired by reloads, newest last (bounded), so operators can see them stop.
    retired: Mutex<VecDeque<Arc<Instance>>>,
    pub metrics: Metrics,
    pub cache_dir: PathBuf,
    config_path: Option<PathBuf>,
    /// Bounds the CPU work of request parsing on the blocking pool (see [`Self::off_the_runtime`]).
    heavy_work: Arc<tokio::sync::Semaphore>,
    /// Set once, by [`Self::shutdown`]: `/ready` answers 503, new requests and reloads are
    /// refused, and what is in flight finishes.
    terminating: AtomicBool,
}

const RETIRED_HISTORY: usize = 64;

/// Trims `history` towards `cap`, oldest first among the entries that `done` lets go. One still
/// at work (a draining instance) stays past the cap: its status and its `vllm:*` series must
/// last until it stops, and it stops within `drain_timeout_secs`, after which the next trim
/// takes it.
fn trim_history<T>(history: &mut VecDeque<T>, cap: usize, done: impl Fn(&T) -> bool) {
    while history.len() > cap {
        match history.iter().position(&done) {
            Some(oldest_done) => {
                history.remove(oldest_done);
            }
            None => break,
        }
    }
}

/// The largest request body parsed and admitted on the async thread that received it (see
/// [`Runtime::parse_body`]): 4 KiB of JSON parses, and its prompt tokenizes, in microseconds,
/// and it holds no media worth decoding.
pub const INLINE_PARSE_BYTES: usize = 4 * 1024;

impl Runtime {
    /// A runtime with nothing loaded. `config_path` is where reloads read from.
    pub fn new(config_path: Option<PathBuf>, cache_dir: PathBuf) -> std::io::Result<Arc<Self>> {
        let shadow = cache_dir
            .join("shadow")
            .join(std::process::id().to_string());
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(Deployment::empty()),
            registry: Registry::new(shadow)?,
            reload_lock: tokio::sync::Mutex::new(()),
            next_generation: AtomicU64::new(1),
            next_request: AtomicU64::new(1),
            // std's hasher keys are drawn from the OS's randomness once per process.
            response_id_prefix: format!(
                "{:016x}",
                std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    std::process::id(),
                )
            ),
            retired: Mutex::new(VecDeque::new()),
            metrics: Metrics::new(),
            cache_dir,
            config_path,
            terminating: AtomicBool::new(false),
            heavy_work: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()),
            )),
        }))
    }

    /// A runtime for the config file at `path`, with the cache directory `config` names.
    pub fn for_config(path: &Path, config: &ValidConfig) -> std::io::Result<Arc<Self>> {
        let cache_dir = config
            .server()
            .cache_dir
            .clone()
            .unwrap_or_else(config::default_cache_dir);
        Self::new(Some(path.to_path_buf()), cache_dir)
    }

    pub fn current(&self) -> Arc<Deployment> {
        self.current.load_full()
    }

    /// `retry_after_secs` of the current `[server]`, read without taking a reference to the
    /// deployment: every request asks, and each reference taken and dropped is a write to a
    /// count that all the server's threads share.
    pub fn retry_after_secs(&self) -> u32 {
        self.current.load().config.server().retry_after_secs
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn config_path(&self) -> Option<&Path> {
        self.config_path.as_deref()
    }

    /// The `model` label for a requested model name: the name itself when the current
    /// deployment answers it (a route's name or an instance's), else [`metrics::UNKNOWN_MODEL`].
    /// So a client's string never becomes a label value.
    pub fn model_label<'a>(&self, requested: &'a str) -> &'a str {
        let deployment = self.current();
        let config = &deployment.config;
        let known = requested.is_empty()
            || config.models().iter().any(|m| m.name == requested)
            || config
                .routes()
                .iter()
                .any(|r| r.models.iter().any(|m| m == requested));
        if known {
            requested
        } else {
            metrics::UNKNOWN_MODEL
        }
    }

    pub fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// The `id` of the answer to request `id`: `kind` (`chatcmpl`, `cmpl`), then a prefix drawn
    /// at random for this process and the request's number, unique across restarts.
    pub fn response_id(&self, kind: &str, id: u64) -> String {
        // Written by hand: `format!` cost 1,200 instructions a request here (2 % of the
        // router's share, `scripts/profile-router.sh`).
        let digits = (64 - (id | 1).leading_zeros()).div_ceil(4) as usize;
        let mut out =
            String::with_capacity(kind.len() + 1 + self.response_id_prefix.len() + digits);
        out.push_str(kind);
        out.push('-');
        out.push_str(&self.response_id_prefix);
        for shift in (0..digits).rev() {
            let digit = (id >> (4 * shift)) & 0xf;
            out.push(char::from_digit(digit as u32, 16).expect("a hex digit"));
        }
        out
    }

    /// Runs `work` over a request body of `body_bytes` where it costs least: at once on this
    /// thread for a small body (its parse takes microseconds, less than the two thread
    /// switches of the blocking pool, which were most of a short request's cost), else through
    /// [`Self::off_the_runtime`].
    pub async fn parse_body<T: Send + 'static>(
        &self,
        body_bytes: usize,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        if body_bytes <= INLINE_PARSE_BYTES {
            work()
        } else {
            self.off_the_runtime(work).await
        }
    }

    /// Runs `work` (a large body's JSON parse, base64 media decoding) on tokio's blocking pool,
    /// at most one job per core at once; the caller waits asynchronously for a turn.
    ///
    /// The job holds its turn until it ends, not the caller: a client that sends a large body
    /// and goes away drops the caller, but a blocking job cannot be stopped, and a turn handed
    /// back then would let such clients run any number of parses at once.
    pub async fn off_the_runtime<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let turn = self
            .heavy_work
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            work()
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    /// Libraries mapped but not used by the current deployment.
    pub fn retired_libraries(&self) -> usize {
        let deployment = self.current();
        self.registry
            .loaded_count()
            .saturating_sub(deployment.plugins.len())
    }

    pub fn retired_instances(&self) -> Vec<Arc<Instance>> {
        self.retired.lock().unwrap().iter().cloned().collect()
    }

    /// What the gauges show now: the current instances, then the retired ones still stopping.
    pub fn metrics_snapshot(&self) -> metrics::Snapshot {
        let deployment = self.current();
        let retiring = self
            .retired_instances()
            .into_iter()
            .filter(|i| i.state() != InstanceState::Stopped);
        let current = deployment.instances().map(|i| instance_gauges(i, false));
        let instances = current
            .chain(retiring.map(|i| instance_gauges(&i, true)))
            .collect();
        metrics::Snapshot {
            instances,
            retired_libraries: self.retired_libraries(),
            loaded_libraries: self.registry.loaded_count(),
        }
    }

    /// Gives every serving instance its `vllm:*` series now (an idle one shows zeros, as the
    /// picker expects one series per instance) and drops those of label sets no instance
    /// serves under any more: instances stopped, names changed by a reload. Call it holding
    /// the reload turn ([`Self::reload_turn`]), so that it sees the deployment last swapped in.
    pub(crate) fn refresh_vllm_series(&self) {
        let deployment = self.current();
        let retiring = self.retired_instances();
        let live: Vec<_> = deployment
            .instances()
            .inspect(|instance| {
                instance.request_series(&self.metrics);
            })
            .chain(
                retiring
                    .iter()
                    .filter(|i| i.state() != InstanceState::Stopped),
            )
            .map(|instance| instance.served_labels())
            .collect();
        self.metrics.keep_vllm_series(live.iter().map(|l| &**l));
    }

    /// Held by a reload from start to swap.
    pub(crate) async fn reload_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reload_lock.lock().await
    }

    pub(crate) fn next_generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes `next` the current deployment and returns the one it replaced.
    pub(crate) fn swap(&self, next: Deployment) -> Arc<Deployment> {
        self.current.swap(Arc::new(next))
    }

    /// Keeps `instance` in the (bounded) list of retired instances.
    pub(crate) fn remember_retired(&self, instance: Arc<Instance>) {
        let mut history = self.retired.lock().unwrap();
        history.push_back(instance);
        trim_history(&mut history, RETIRED_HISTORY, |i| {
            i.state() == InstanceState::Stopped
        });
    }

    /// Whether the process is shutting down (see [`Self::shutdown`]).
    pub fn is_terminating(&self) -> bool {
        self.terminating.load(Ordering::Acquire)
    }

    /// Drains every instance of the current deployment (process shutdown): from the first
    /// moment, `/ready` answers 503 and new requests and reloads are refused; the requests in
    /// flight get until `deadline` to finish.
    pub async fn shutdown(&self, deadline: Duration) {
        self.terminating.store(true, Ordering::Release);
        let until = tokio::time::Instant::now() + deadline;
        // A reload that is past its check swaps first; the deadline bounds the wait for it.
        let turn = tokio::time::timeout_at(until, self.reload_turn()).await;
        let deployment = self.current();
        let all: Vec<_> = deployment.instances().cloned().collect();
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let waits = all.into_iter().map(|i| i.drain_and_stop(left));
        futures_util::future::join_all(waits).await;
        drop(turn);
        self.remove_shadow_copies();
    }

    /// Removes this process's copies of the plugin libraries, as it exits (the loaded ones
    /// stay mapped). A process that failed to start removes them too: they are sized like the
    /// plugins (tens of MB), and no later process reads another's.
    pub fn remove_shadow_copies(&self) {
        let _ = std::fs::remove_dir_all(self.registry.shadow_dir());
    }
}

fn instance_gauges(instance: &Instance, retiring: bool) -> metrics::InstanceGauges {
    let stats = instance.stats();
    // A 2.0 plugin's stats carry no resources: the defaults, and so the fallbacks.
    let resources = stats.resources().unwrap_or_default();
    let state = instance.state();
    metrics::InstanceGauges {
        served: (*instance.served_labels()).clone(),
        retiring,
        kv_usage: kv_usage(&stats, &resources),
        lora: instance.lora_info(&resources),
        labels: metrics::InstanceLabels {
            instance: instance.name.clone().into(),
            plugin: instance.plugin.manifest.name.to_string().into(),
            plugin_version: instance.plugin.version().to_string().into(),
        },
        in_flight: instance.in_flight(),
        queued: stats.queued,
        running: stats.running,
        free_slots: stats.free_slots,
        adapter_rows: stats
            .adapters
            .iter()
            .map(|a| (a.adapter.to_string(), a.rows))
            .collect(),
        state: state.name(),
        ready: state == InstanceState::Ready,
    }
}

/// `vllm:kv_cache_usage_perc`: the fraction of the KV capacity the plugin reports in use, or,
/// from a plugin that reports none (API 2.0, or no KV cache to count), the fraction of its slots
/// in use; 0 without slots. Clamped to 0..=1, which the protocol promises the picker.
fn kv_usage(stats: &ModelStats, resources: &ModelResources) -> f64 {
    let (used, capacity) = if resources.kv_capacity_tokens > 0 {
        (resources.kv_used_tokens, resources.kv_capacity_tokens)
    } else {
        let running = u64::from(stats.running);
        (running, running + u64::from(stats.free_slots))
    };
    if capacity == 0 {
        return 0.0;
    }
    (used as f64 / capacity as f64).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn response_ids_are_a_process_prefix_and_the_number_in_hex() {
        let dir = std::env::temp_dir().join(format!("switchyard-ids-{}", std::process::id()));
        let (a, b) = (
            Runtime::new(None, dir.clone()).unwrap(),
            Runtime::new(None, dir.clone()).unwrap(),
        );
        for id in [0, 1, 9, 10, 15, 16, 255, 256, 4096, u64::MAX] {
            let got = a.response_id("cmpl", id);
            assert_eq!(got, format!("cmpl-{}{id:x}", a.response_id_prefix));
        }
        assert_eq!(a.response_id_prefix.len(), 16);
        assert_ne!(a.response_id_prefix, b.response_id_prefix);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_retired_history_lets_stopped_entries_go_first_and_keeps_draining_ones() {
        // Entries are (id, stopped).
        let mut history: VecDeque<(u32, bool)> = (0..4).map(|id| (id, id % 2 == 1)).collect();
        history.push_back((4, false));
        trim_history(&mut history, 4, |e| e.1);
        // The oldest stopped one (1) went; the older draining one (0) stayed.
        assert_eq!(
            history.iter().map(|e| e.0).collect::<Vec<_>>(),
            [0, 2, 3, 4]
        );
        history.push_back((5, false));
        history.push_back((6, false));
        trim_history(&mut history, 4, |e| e.1);
        // 3 was the last stopped one; the draining ones outlast the cap.
        assert_eq!(
            history.iter().map(|e| e.0).collect::<Vec<_>>(),
            [0, 2, 4, 5, 6]
        );
        history.iter_mut().for_each(|e| e.1 = true);
        history.push_back((7, true));
        trim_history(&mut history, 4, |e| e.1);
        assert_eq!(
            history.iter().map(|e| e.0).collect::<Vec<_>>(),
            [4, 5, 6, 7]
        );
    }

    #[tokio::test]
    async fn a_heavy_job_keeps_its_turn_after_its_caller_is_gone() {
        let cache = std::env::temp_dir().join(format!("switchyard-runtime-{}", std::process::id()));
        let runtime = Runtime::new(None, cache.clone()).unwrap();
        let turns = runtime.heavy_work.available_permits();
        let (started_tx, started) = mpsc::channel();
        let (finish, finish_rx) = mpsc::channel::<()>();
        let caller = {
            let runtime = runtime.clone();
            tokio::spawn(async move {
                runtime
                    .off_the_runtime(move || {
                        started_tx.send(()).unwrap();
                        finish_rx.recv().unwrap();
                    })
                    .await
            })
        };
        tokio::task::spawn_blocking(move || started.recv().unwrap())
            .await
            .unwrap();
        // The client goes away: its handler, the caller, is dropped mid-job.
        caller.abort();
        assert!(caller.await.unwrap_err().is_cancelled());
        assert_eq!(
            runtime.heavy_work.available_permits(),
            turns - 1,
            "the running job still holds its turn"
        );
        finish.send(()).unwrap();
        for _ in 0..200 {
            if runtime.heavy_work.available_permits() == turns {
                let _ = std::fs::remove_dir_all(&cache);
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the turn was not handed back when the job ended");
    }
}
