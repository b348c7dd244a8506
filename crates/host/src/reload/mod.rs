//! Reload: build the next deployment beside the current one (load libraries, create and warm
//! instances), swap it in, then drain the instances it no longer uses. Any failure before the
//! swap leaves the current deployment untouched. The triggers that start a reload besides
//! `POST /admin/reload` (SIGHUP, a watched config file) are in [`triggers`].

mod create;
mod error;
pub mod triggers;

pub use error::ReloadError;

use crate::{
    config::{self, ValidConfig},
    deployment::Deployment,
    instance::{fingerprint, Instance, InstanceLimits, InstanceState},
    registry::{file_sha256, LoadedPlugin, RegistryError},
    router::RouteTable,
    runtime::Runtime,
};
use serde::Serialize;
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

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

impl Runtime {
    /// Reloads from the config file. A file that does not parse or validate fails the reload
    /// like any other cause: logged, counted, and the current deployment keeps serving.
    pub async fn reload_from_file(self: &Arc<Self>) -> Result<ReloadReport, ReloadError> {
        let path = self
            .config_path()
            .map(ToOwned::to_owned)
            .ok_or(ReloadError::NoSource)?;
        let loaded = tokio::task::spawn_blocking(move || config::load(&path))
            .await
            .expect("config loading does not panic");
        match loaded {
            Ok(config) => self.apply(config).await,
            Err(e) => self.outcome(Err(e.into())),
        }
    }

    /// Builds a deployment from `config` and swaps it in; see the module docs.
    pub async fn apply(self: &Arc<Self>, config: ValidConfig) -> Result<ReloadReport, ReloadError> {
        // Refused at once during a shutdown, which holds the turn while it drains; and after
        // the turn, for a shutdown drains the deployment it finds and nothing may be swapped in
        // after it. Logged, not counted: nothing was tried.
        let refused = || {
            tracing::warn!("reload refused: the server is shutting down (SIGTERM)");
            Err(ReloadError::ShuttingDown)
        };
        if self.is_terminating() {
            return refused();
        }
        let _one_at_a_time = self.reload_turn().await;
        if self.is_terminating() {
            return refused();
        }
        let started = Instant::now();
        let result = self.build_and_swap(config, started).await;
        self.outcome(result)
    }

    /// Counts and logs a reload's result, whatever started it and wherever it failed.
    fn outcome(
        &self,
        result: Result<ReloadReport, ReloadError>,
    ) -> Result<ReloadReport, ReloadError> {
        self.metrics.reload(result.is_ok());
        match &result {
            Ok(report) => {
                tracing::info!(generation = report.generation, created = ?report.created, reused = ?report.reused,
                    retiring = ?report.retiring, "reload applied");
            }
            Err(e) if self.current().generation == 0 => {
                // The first load: there is no previous configuration to keep serving.
                tracing::error!(error = %e, "the configuration could not be loaded");
            }
            Err(e) => {
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
        let mut to_create = Vec::new();
        for (index, model) in config.models().iter().enumerate() {
            let plugin = plugins[&model.plugin].clone();
            let limits = InstanceLimits::of(model, config.server());
            let fingerprint = fingerprint(model, &plugin.sha256, &limits);
            let existing = current
                .table
                .instances()
                .get(&model.name)
                .filter(|i| i.fingerprint == fingerprint && i.state() == InstanceState::Ready);
            match existing {
                Some(existing) => {
                    instances.insert(model.name.clone(), existing.clone());
                    reused.push(model.name.clone());
                }
                None => to_create.push((index, model, plugin, limits)),
            }
        }
        // Every plugin that can checks its new models' settings first, so that one refused
        // fails the reload before any other model loads its weights (minutes, at real scale).
        let checks: Vec<_> = to_create
            .iter()
            .map(|(index, model, plugin, _)| (*index, (*model).clone(), plugin.clone()))
            .collect();
        let config_dir = config.base_dir().to_path_buf();
        // The checks read files (a checkpoint's headers, its tokenizer): on a hung mount they
        // would hold the reload turn for ever, so they get the creation's time limit.
        let secs = config.server().reload_timeout_secs;
        let names: Vec<_> = checks
            .iter()
            .map(|(i, m, _)| (*i, m.name.clone()))
            .collect();
        let at = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let checking = {
            let at = at.clone();
            tokio::task::spawn_blocking(move || create::check_settings(&checks, &config_dir, &at))
        };
        match tokio::time::timeout(Duration::from_secs_f64(secs), checking).await {
            Ok(checked) => checked.expect("the settings checks catch their panics")?,
            Err(_) => {
                // A timeout has a check under way (none are there to time out when `names`
                // is empty).
                let under_way = at.load(std::sync::atomic::Ordering::Relaxed);
                let (index, name) = names.get(under_way).cloned().unwrap_or_default();
                return Err(ReloadError::CheckTimeout { index, name, secs });
            }
        }
        for (index, model, plugin, limits) in to_create {
            let cache_dir = self.cache_dir.clone();
            let model_cfg = model.clone();
            let config_dir = config.base_dir().to_path_buf();
            let mut making = tokio::task::spawn_blocking(move || {
                create::instance(index, &model_cfg, &config_dir, &cache_dir, plugin, limits)
            });
            let secs = config.server().reload_timeout_secs;
            let made = match tokio::time::timeout(Duration::from_secs_f64(secs), &mut making).await
            {
                Ok(joined) => joined.expect("instance creation catches its panics"),
                Err(_) => {
                    // The plugin's thread cannot be stopped; whatever it makes when it is done
                    // is stopped at once, and this reload fails now.
                    tokio::spawn(async move {
                        if let Ok(Ok(late)) = making.await {
                            tracing::warn!(instance = %late.name, "a timed-out instance finished creating; stopping it");
                            let _ = tokio::task::spawn_blocking(move || late.stop_now()).await;
                        }
                    });
                    Err(ReloadError::Timeout {
                        index,
                        name: model.name.clone(),
                        secs,
                    })
                }
            };
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

        for (name, instance) in &instances {
            instance.set_served_names(config.served_names(name));
        }
        let table = RouteTable::build(&config, instances.clone());
        let mut used: Vec<Arc<LoadedPlugin>> = plugins.into_values().collect();
        used.sort_by(|a, b| a.sha256.cmp(&b.sha256));
        used.dedup_by(|a, b| a.sha256 == b.sha256);
        if self.is_terminating() {
            stop_all(created).await;
            return Err(ReloadError::ShuttingDown);
        }
        let generation = self.next_generation();
        let drain_deadline = Duration::from_secs_f64(config.server().drain_timeout_secs);
        let previous = self.swap(Deployment {
            generation,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            config,
            table,
            plugins: used.clone(),
        });

        if previous.generation > 0 {
            let waiting = previous
                .config
                .server()
                .start_only_changes(self.current().config.server());
            if !waiting.is_empty() {
                tracing::warn!(
                    keys = ?waiting,
                    "these [server] keys changed, and take effect only at start: restart to \
                     apply them"
                );
            }
        }

        // Drain what the new deployment no longer uses, in the background.
        let retiring: Vec<Arc<Instance>> = previous
            .instances()
            .filter(|old| !instances.values().any(|new| Arc::ptr_eq(old, new)))
            .cloned()
            .collect();
        for instance in &retiring {
            self.remember_retired(instance.clone());
            let runtime = self.clone();
            let instance = instance.clone();
            tokio::spawn(async move {
                drain(instance, drain_deadline).await;
                // In turn with reloads: a refresh that read an older deployment while a reload
                // swapped in a newer one would drop the new instances' series for good (they
                // keep the series they resolved, so nothing would add them back).
                let _turn = runtime.reload_turn().await;
                runtime.refresh_vllm_series();
            });
        }
        self.refresh_vllm_series();

        let label = |i: &Arc<Instance>| format!("{} ({})", i.name, i.plugin_label());
        Ok(ReloadReport {
            generation,
            created: created.iter().map(label).collect(),
            reused,
            retiring: retiring.iter().map(label).collect(),
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
        for plugin in config.plugins() {
            let sha = file_sha256(&plugin.path).map_err(|source| RegistryError::Read {
                name: plugin.name.clone(),
                path: plugin.path.clone(),
                source,
            })?;
            shas.push(sha);
        }
        self.registry()
            .check_retired_cap(&shas, config.server().retired_library_cap)?;
        let mut out = HashMap::new();
        for plugin in config.plugins() {
            let loaded =
                self.registry()
                    .load(&plugin.name, &plugin.path, plugin.sha256.as_deref())?;
            out.insert(plugin.name.clone(), loaded);
        }
        Ok(out)
    }
}

async fn drain(instance: Arc<Instance>, deadline: Duration) {
    let name = instance.name.clone();
    let version = instance.plugin_label();
    let left = instance.drain_and_stop(deadline).await;
    if left > 0 {
        tracing::warn!(instance = %name, plugin = %version, cancelled = left, "drain deadline passed; cancelled the rest");
    } else {
        tracing::info!(instance = %name, plugin = %version, "instance drained and stopped");
    }
}

async fn stop_all(instances: Vec<Arc<Instance>>) {
    for instance in instances {
        let _ = tokio::task::spawn_blocking(move || instance.stop_now()).await;
    }
}
