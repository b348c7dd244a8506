//! The serving state and its replacement. A [`Generation`] is one validated config with its
//! loaded plugins, created instances and route table; the current one sits behind `arc-swap`, so
//! a request resolves without locks. A reload builds the next generation beside the current one
//! (load libraries, create and warm instances), swaps it in, then drains the instances that are
//! no longer used. Any failure before the swap leaves the current generation untouched.

use crate::{
    config::{self, ValidConfig},
    instance::{Instance, InstanceState},
    metrics::{self, Metrics},
    registry::{LoadedPlugin, Registry, RegistryError},
    router::RouteTable,
};
use abi_stable::std_types::{RResult, RStr};
use arc_swap::ArcSwap;
use serde::Serialize;
use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};
use switchyard_plugin_api::{HostServices, LogLevel, SettingsText};

pub struct Generation {
    pub id: u64,
    pub config: ValidConfig,
    pub table: RouteTable,
    pub plugins: Vec<Arc<LoadedPlugin>>,
}

impl Generation {
    fn empty() -> Self {
        let config = config::validate(
            serde_json::from_str::<config::Config>("{}").expect("empty config"),
            Path::new("."),
            None,
        )
        .expect("empty config is valid");
        Self {
            id: 0,
            table: RouteTable::build(&config, HashMap::new()),
            config,
            plugins: Vec::new(),
        }
    }

    pub fn instances(&self) -> impl Iterator<Item = &Arc<Instance>> {
        self.table.instances().values()
    }
}

#[derive(Debug, Serialize)]
pub struct ReloadReport {
    pub generation: u64,
    pub created: Vec<String>,
    pub reused: Vec<String>,
    pub retiring: Vec<String>,
    pub plugins: Vec<String>,
    pub retired_libraries: usize,
    pub duration_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] config::ConfigErrors),
    #[error("{0}")]
    Plugin(#[from] RegistryError),
    #[error("models[{index}] ({name}): plugin {plugin} has no model kind {kind:?} (it has {available:?})")]
    UnknownKind {
        index: usize,
        name: String,
        plugin: String,
        kind: String,
        available: Vec<String>,
    },
    #[error("models[{index}] ({name}): creation failed: {message}")]
    Create {
        index: usize,
        name: String,
        message: String,
    },
    #[error("models[{index}] ({name}): warm-up failed: {message}")]
    Warm {
        index: usize,
        name: String,
        message: String,
    },
    #[error("no config file to reload from")]
    NoSource,
}

pub struct Runtime {
    current: ArcSwap<Generation>,
    registry: Registry,
    reload_lock: tokio::sync::Mutex<()>,
    next_generation: AtomicU64,
    next_request: AtomicU64,
    /// Instances retired by reloads, newest last (bounded), so operators can see them stop.
    retired: Mutex<VecDeque<Arc<Instance>>>,
    pub metrics: Metrics,
    pub cache_dir: PathBuf,
    config_path: Option<PathBuf>,
}

const RETIRED_HISTORY: usize = 64;

impl Runtime {
    /// A runtime with nothing loaded. `config_path` is where reloads read from.
    pub fn new(config_path: Option<PathBuf>, cache_dir: PathBuf) -> std::io::Result<Arc<Self>> {
        let shadow = cache_dir
            .join("shadow")
            .join(std::process::id().to_string());
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(Generation::empty()),
            registry: Registry::new(shadow)?,
            reload_lock: tokio::sync::Mutex::new(()),
            next_generation: AtomicU64::new(1),
            next_request: AtomicU64::new(1),
            retired: Mutex::new(VecDeque::new()),
            metrics: Metrics::new(),
            cache_dir,
            config_path,
        }))
    }

    pub fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn config_path(&self) -> Option<&Path> {
        self.config_path.as_deref()
    }

    pub fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Libraries mapped but not used by the current generation.
    pub fn retired_libraries(&self) -> usize {
        let generation = self.current();
        self.registry
            .loaded_count()
            .saturating_sub(generation.plugins.len())
    }

    pub fn retired_instances(&self) -> Vec<Arc<Instance>> {
        self.retired.lock().unwrap().iter().cloned().collect()
    }

    /// What the gauges show now: the current instances, then the retired ones still stopping.
    pub fn metrics_snapshot(&self) -> metrics::Snapshot {
        let generation = self.current();
        let retiring = self
            .retired_instances()
            .into_iter()
            .filter(|i| i.state() != InstanceState::Stopped);
        let instances = generation
            .instances()
            .cloned()
            .chain(retiring)
            .map(|instance| {
                let stats = instance.stats();
                let state = instance.state();
                metrics::InstanceGauges {
                    labels: metrics::InstanceLabels {
                        instance: instance.name.clone(),
                        plugin: instance.plugin.manifest.name.to_string(),
                        plugin_version: instance.plugin.version().to_string(),
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
            })
            .collect();
        metrics::Snapshot {
            instances,
            retired_libraries: self.retired_libraries(),
            loaded_libraries: self.registry.loaded_count(),
        }
    }

    /// Reloads from the config file.
    pub async fn reload_from_file(self: &Arc<Self>) -> Result<ReloadReport, ReloadError> {
        let path = self.config_path.clone().ok_or(ReloadError::NoSource)?;
        let config = tokio::task::spawn_blocking(move || config::load(&path))
            .await
            .expect("config loading does not panic")?;
        self.apply(config).await
    }

    /// Builds a generation from `config` and swaps it in; see the module docs.
    pub async fn apply(self: &Arc<Self>, config: ValidConfig) -> Result<ReloadReport, ReloadError> {
        let _one_at_a_time = self.reload_lock.lock().await;
        let started = Instant::now();
        let result = self.build_and_swap(config, started).await;
        match &result {
            Ok(report) => {
                self.metrics.reload(true);
                tracing::info!(generation = report.generation, created = ?report.created, reused = ?report.reused,
                    retiring = ?report.retiring, "reload applied");
            }
            Err(e) => {
                self.metrics.reload(false);
                tracing::error!(error = %e, "reload failed; the previous configuration keeps serving");
            }
        }
        result
    }

    async fn build_and_swap(
        self: &Arc<Self>,
        config: ValidConfig,
        started: Instant,
    ) -> Result<ReloadReport, ReloadError> {
        let this = self.clone();
        let cfg = config.clone();
        let plugins = tokio::task::spawn_blocking(move || this.load_plugins(&cfg))
            .await
            .expect("plugin loading catches its panics")?;

        let current = self.current();
        let mut instances: HashMap<String, Arc<Instance>> = HashMap::new();
        let mut created = Vec::new();
        let mut reused = Vec::new();
        for (index, model) in config.models.iter().enumerate() {
            let plugin = plugins[&model.plugin].clone();
            let fingerprint = crate::instance::fingerprint(model, &plugin.sha256);
            let existing = current
                .table
                .instances()
                .get(&model.name)
                .filter(|i| i.fingerprint == fingerprint && i.state() == InstanceState::Ready);
            if let Some(existing) = existing {
                instances.insert(model.name.clone(), existing.clone());
                reused.push(model.name.clone());
                continue;
            }
            let this = self.clone();
            let model_cfg = model.clone();
            let config_dir = config.base_dir.clone();
            let made = tokio::task::spawn_blocking(move || {
                this.create_instance(index, &model_cfg, &config_dir, plugin)
            })
            .await
            .expect("instance creation catches its panics");
            match made {
                Ok(instance) => {
                    created.push(instance.clone());
                    instances.insert(model.name.clone(), instance);
                }
                Err(e) => {
                    // Nothing was swapped: stop what this attempt created and keep serving.
                    stop_all(created).await;
                    return Err(e);
                }
            }
        }

        let table = RouteTable::build(&config, instances.clone());
        let mut used: Vec<Arc<LoadedPlugin>> = plugins.into_values().collect();
        used.sort_by(|a, b| a.sha256.cmp(&b.sha256));
        used.dedup_by(|a, b| a.sha256 == b.sha256);
        let generation = Generation {
            id: self.next_generation.fetch_add(1, Ordering::Relaxed),
            config: config.clone(),
            table,
            plugins: used.clone(),
        };
        let id = generation.id;
        let previous = self.current.swap(Arc::new(generation));

        // Drain what the new generation no longer uses, in the background.
        let retiring: Vec<Arc<Instance>> = previous
            .instances()
            .filter(|old| !instances.values().any(|new| Arc::ptr_eq(old, new)))
            .cloned()
            .collect();
        let deadline = Duration::from_secs_f64(config.server.drain_timeout_secs);
        for instance in &retiring {
            let mut history = self.retired.lock().unwrap();
            history.push_back(instance.clone());
            while history.len() > RETIRED_HISTORY {
                history.pop_front();
            }
            let instance = instance.clone();
            tokio::spawn(async move {
                let name = instance.name.clone();
                let version = instance.plugin_label();
                let left = instance.drain_and_stop(deadline).await;
                if left > 0 {
                    tracing::warn!(instance = %name, plugin = %version, cancelled = left, "drain deadline passed; cancelled the rest");
                } else {
                    tracing::info!(instance = %name, plugin = %version, "instance drained and stopped");
                }
            });
        }

        Ok(ReloadReport {
            generation: id,
            created: created
                .iter()
                .map(|i| format!("{} ({})", i.name, i.plugin_label()))
                .collect(),
            reused,
            retiring: retiring
                .iter()
                .map(|i| format!("{} ({})", i.name, i.plugin_label()))
                .collect(),
            plugins: used.iter().map(|p| p.label()).collect(),
            retired_libraries: self.retired_libraries(),
            duration_ms: started.elapsed().as_millis() as u64,
        })
    }

    fn load_plugins(
        &self,
        config: &ValidConfig,
    ) -> Result<HashMap<String, Arc<LoadedPlugin>>, ReloadError> {
        // Hash first, so the retired-library cap is checked before anything new is mapped.
        let mut shas = Vec::new();
        for plugin in &config.plugins {
            let sha = crate::registry::file_sha256(&plugin.path).map_err(|source| {
                RegistryError::Read {
                    name: plugin.name.clone(),
                    path: plugin.path.clone(),
                    source,
                }
            })?;
            shas.push(sha);
        }
        self.registry
            .check_retired_cap(&shas, config.server.retired_library_cap)?;
        let mut out = HashMap::new();
        for plugin in &config.plugins {
            let loaded =
                self.registry
                    .load(&plugin.name, &plugin.path, plugin.sha256.as_deref())?;
            out.insert(plugin.name.clone(), loaded);
        }
        Ok(out)
    }

    fn create_instance(
        &self,
        index: usize,
        model: &config::ModelConfig,
        config_dir: &Path,
        plugin: Arc<LoadedPlugin>,
    ) -> Result<Arc<Instance>, ReloadError> {
        let Some(kind) = plugin.manifest.kind(&model.kind).cloned() else {
            return Err(ReloadError::UnknownKind {
                index,
                name: model.name.clone(),
                plugin: plugin.label(),
                kind: model.kind.clone(),
                available: plugin
                    .manifest
                    .models
                    .iter()
                    .map(|m| m.kind.to_string())
                    .collect(),
            });
        };
        let cache_dir = self
            .cache_dir
            .join("plugins")
            .join(plugin.manifest.name.as_str());
        let _ = std::fs::create_dir_all(&cache_dir);
        let threads = model.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        });
        let services = HostServices {
            log: host_log,
            cache_dir: cache_dir.to_string_lossy().into_owned().into(),
            thread_budget: threads,
            instance_name: model.name.clone().into(),
            config_dir: config_dir.to_string_lossy().into_owned().into(),
        };
        let settings = SettingsText::json(model.settings.to_string());
        let made =
            (plugin.module.create_model())(RStr::from(model.kind.as_str()), settings, services);
        let model_box = match made {
            RResult::ROk(m) => m,
            RResult::RErr(e) => {
                return Err(ReloadError::Create {
                    index,
                    name: model.name.clone(),
                    message: e.to_string(),
                })
            }
        };
        let instance = Arc::new(Instance::new(model, plugin, kind, model_box));
        if let Err(e) = instance.warm() {
            instance.stop_now();
            return Err(ReloadError::Warm {
                index,
                name: model.name.clone(),
                message: e.to_string(),
            });
        }
        tracing::info!(instance = %instance.name, plugin = %instance.plugin_label(), "instance ready");
        Ok(instance)
    }

    /// Drains every instance of the current generation (process shutdown).
    pub async fn shutdown(&self, deadline: Duration) {
        let generation = self.current();
        let all: Vec<_> = generation.instances().cloned().collect();
        let waits = all.into_iter().map(|i| i.drain_and_stop(deadline));
        futures_util::future::join_all(waits).await;
        let _ = std::fs::remove_dir_all(self.registry.shadow_dir());
    }
}

async fn stop_all(instances: Vec<Arc<Instance>>) {
    for instance in instances {
        let _ = tokio::task::spawn_blocking(move || instance.stop_now()).await;
    }
}

/// The log callback handed to plugins: their records go into the host's `tracing` output.
extern "C" fn host_log(level: LogLevel, target: RStr<'_>, message: RStr<'_>) {
    let (instance, message) = (target.as_str(), message.as_str());
    match level {
        LogLevel::Error => tracing::error!(target: "plugin", instance, "{message}"),
        LogLevel::Warn => tracing::warn!(target: "plugin", instance, "{message}"),
        LogLevel::Info => tracing::info!(target: "plugin", instance, "{message}"),
        LogLevel::Debug => tracing::debug!(target: "plugin", instance, "{message}"),
        LogLevel::Trace => tracing::trace!(target: "plugin", instance, "{message}"),
    }
}
