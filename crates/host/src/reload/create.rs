//! Creating and warming one model instance for a reload: the host services a plugin gets, the
//! plugin's `create_model`, then its warm-up. Blocking; the reload runs it off the async threads.

use super::error::ReloadError;
use crate::{
    config::ModelConfig,
    instance::{Instance, InstanceLimits},
    registry::{self, LoadedPlugin, SettingsVerdict},
};
use abi_stable::std_types::{RResult, RStr};
use std::{path::Path, sync::Arc};
use switchyard_plugin_api::{HostServices, LogLevel, SettingsText};

/// `index` is the model's place in the config (errors name it), `config_dir` the directory its
/// settings' relative paths start from, `cache_root` the host's cache directory.
pub fn instance(
    index: usize,
    model: &ModelConfig,
    config_dir: &Path,
    cache_root: &Path,
    plugin: Arc<LoadedPlugin>,
    limits: InstanceLimits,
) -> Result<Arc<Instance>, ReloadError> {
    let Some(kind) = plugin.manifest.kind(&model.kind).cloned() else {
        return Err(unknown_kind(index, model, &plugin));
    };
    let cache_dir = cache_root
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
    // Creating can take minutes (a checkpoint to load, modules to compile): the log says what
    // the process is doing before `/ready` answers, and "instance ready" says when it is done.
    tracing::info!(instance = %model.name, plugin = %plugin.label(), "creating instance");
    let made = (plugin.module.create_model())(RStr::from(model.kind.as_str()), settings, services);
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
    let instance = Arc::new(Instance::new(model, plugin, kind, model_box, limits));
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

fn unknown_kind(index: usize, model: &ModelConfig, plugin: &LoadedPlugin) -> ReloadError {
    ReloadError::UnknownKind {
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
    }
}

/// Has each model's plugin check its kind and settings (plugin API 2.2) before any is created:
/// the first refusal. A plugin without a check passes; its creation checks them. `at` is set
/// to the place in `models` of the check under way, for a caller that stops waiting to name it.
pub fn check_settings(
    models: &[(usize, ModelConfig, Arc<LoadedPlugin>)],
    config_dir: &Path,
    at: &std::sync::atomic::AtomicUsize,
) -> Result<(), ReloadError> {
    for (i, (index, model, plugin)) in models.iter().enumerate() {
        at.store(i, std::sync::atomic::Ordering::Relaxed);
        if plugin.manifest.kind(&model.kind).is_none() {
            return Err(unknown_kind(*index, model, plugin));
        }
        let verdict = registry::check_settings(
            &plugin.shadow_path,
            &model.kind,
            &model.settings,
            config_dir,
        );
        let message = match verdict {
            Ok(SettingsVerdict::Refused(why)) => why,
            // The library is loaded already: a failure to open it again here is no verdict.
            Ok(SettingsVerdict::Accepted | SettingsVerdict::NotChecked) | Err(_) => continue,
        };
        return Err(ReloadError::Settings {
            index: *index,
            name: model.name.clone(),
            message,
        });
    }
    Ok(())
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
