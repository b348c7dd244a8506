//! `switchyard plugins inspect` and `switchyard config check`: what a plugin file or a config
//! file would do, found without serving.

use crate::{
    config,
    registry::{self, SettingsVerdict},
};
use std::{path::PathBuf, process::ExitCode};

pub fn inspect(file: PathBuf) -> anyhow::Result<ExitCode> {
    // A bare file name would reach `dlopen` without a slash: the library path, not here.
    let file = std::path::absolute(&file)?;
    let sha256 = registry::file_sha256(&file)?;
    let text = registry::read_manifest_text(&file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let manifest: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: the manifest is not JSON: {e}", file.display()))?;
    let verdict = match load_as_serving_would("inspected", &file)? {
        Ok(label) => serde_json::json!({"compatible": true, "loaded_as": label}),
        Err(reason) => serde_json::json!({"compatible": false, "reason": reason}),
    };
    // Unknown (null) for a manifest this host cannot read as its own: still described.
    let settings_check = registry::exports_settings_check(&file).ok();
    let out = serde_json::json!({
        "file": file, "sha256": sha256, "manifest": manifest,
        "host_api_version": switchyard_plugin_api::API_VERSION.to_string(), "check": verdict,
        "settings_check": settings_check,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

/// Loads a plugin file exactly as the registry would (a private copy, abi_stable's layout
/// check, the API version): its label, or why it was refused.
fn load_as_serving_would(
    name: &str,
    file: &std::path::Path,
) -> anyhow::Result<Result<String, String>> {
    let dir = std::env::temp_dir().join(format!("switchyard-check-{}", std::process::id()));
    let registry = registry::Registry::new(dir.clone())?;
    let verdict = match registry.load(name, file, None) {
        Ok(p) => Ok(p.label()),
        Err(e) => Err(e.to_string()),
    };
    let _ = std::fs::remove_dir_all(dir);
    Ok(verdict)
}

pub fn config(file: PathBuf) -> anyhow::Result<ExitCode> {
    let config = match config::load(&file) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{}: invalid", file.display());
            for e in &errors.0 {
                eprintln!("  - {e}");
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut problems = Vec::new();
    let mut checks = Vec::new();
    for (i, plugin) in config.plugins().iter().enumerate() {
        let sha = registry::file_sha256(&plugin.path)?;
        if let Some(pin) = &plugin.sha256 {
            if !pin.eq_ignore_ascii_case(&sha) {
                problems.push(format!("plugins[{i}].sha256: pinned {pin}, file has {sha}"));
            }
        }
        match registry::read_manifest_json(&plugin.path) {
            Err(e) => problems.push(format!("plugins[{i}].path: {e}")),
            Ok(manifest) => {
                // As `serve` would load it: its layout and API version, before anything of it
                // is called.
                if let Err(reason) = load_as_serving_would(&plugin.name, &plugin.path)? {
                    problems.push(format!("plugins[{i}].path: {reason}"));
                    continue;
                }
                for (j, model) in config
                    .models()
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.plugin == plugin.name)
                {
                    if manifest.kind(&model.kind).is_none() {
                        problems.push(format!(
                            "models[{j}].kind: plugin {} has no kind {:?}",
                            plugin.name, model.kind
                        ));
                        continue;
                    }
                    checks.push(SettingsCheck {
                        plugin_index: i,
                        model_index: j,
                        model: model.name.clone(),
                        plugin: plugin.name.clone(),
                        api: manifest.api_version.to_string(),
                        path: plugin.path.clone(),
                        kind: model.kind.clone(),
                        settings: model.settings.clone(),
                    });
                }
            }
        }
    }
    // The plugins' own checks of what each model would be created from, within the time a
    // reload gives them: a checkpoint on a hung mount fails the check as it would fail the
    // reload, instead of hanging it.
    let timeout_secs = config.server().reload_timeout_secs;
    let verdicts = run_within(
        std::time::Duration::from_secs_f64(timeout_secs),
        config.base_dir().to_path_buf(),
        &checks,
    )?;
    let (mut checked, mut unchecked) = (0, Vec::new());
    // The checks run in turn: the first without a verdict is the one that hung, and the rest
    // never began.
    let mut hung = None;
    for (check, verdict) in checks.iter().zip(verdicts) {
        let (j, name) = (check.model_index, &check.model);
        match verdict {
            None => match hung {
                None => {
                    hung = Some(j);
                    problems.push(format!(
                        "models[{j}].settings ({name}): the plugin's settings check did not \
                         finish within reload_timeout_secs = {timeout_secs}"
                    ))
                }
                Some(first) => problems.push(format!(
                    "models[{j}].settings ({name}): not checked: the check of models[{first}] \
                     before it did not finish"
                )),
            },
            Some(Ok(SettingsVerdict::Accepted)) => checked += 1,
            Some(Ok(SettingsVerdict::Refused(why))) => {
                problems.push(format!("models[{j}].settings ({name}): {why}"))
            }
            Some(Ok(SettingsVerdict::NotChecked)) => unchecked.push(format!(
                "models[{j}].settings ({name}): not checked: plugin {} (API {}) exports no \
                 settings check; they are checked when the instance is created",
                check.plugin, check.api
            )),
            Some(Err(e)) => problems.push(format!("plugins[{}].path: {e}", check.plugin_index)),
        }
    }
    for note in &unchecked {
        eprintln!("note: {note}");
    }
    if problems.is_empty() {
        let models = config.models().len();
        println!(
            "{}: ok ({}, {}, {}; settings checked by their plugin for {checked} of {models})",
            file.display(),
            counted(config.plugins().len(), "plugin"),
            counted(models, "model"),
            counted(config.routes().len(), "route"),
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{}: invalid", file.display());
        for p in problems {
            eprintln!("  - {p}");
        }
        Ok(ExitCode::FAILURE)
    }
}

/// `n` and the noun, plural unless `n` is 1: "1 plugin", "0 routes".
fn counted(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// One model's settings, to be checked by its plugin.
struct SettingsCheck {
    plugin_index: usize,
    model_index: usize,
    model: String,
    plugin: String,
    api: String,
    path: PathBuf,
    kind: String,
    settings: serde_json::Value,
}

type Verdict = Result<SettingsVerdict, registry::ManifestError>;

/// Runs the checks in order on a thread of their own and returns each one's verdict, `None` for
/// those that had not answered by `timeout`. The thread of a check that hangs is left behind:
/// the process ends with `config check`, and a plugin's code cannot be stopped anyway.
fn run_within(
    timeout: std::time::Duration,
    config_dir: PathBuf,
    checks: &[SettingsCheck],
) -> std::io::Result<Vec<Option<Verdict>>> {
    let deadline = std::time::Instant::now() + timeout;
    let jobs: Vec<_> = checks
        .iter()
        .map(|c| (c.path.clone(), c.kind.clone(), c.settings.clone()))
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("settings-check".into())
        .spawn(move || {
            for (path, kind, settings) in jobs {
                let verdict = registry::check_settings(&path, &kind, &settings, &config_dir);
                if tx.send(verdict).is_err() {
                    return;
                }
            }
        })?;
    let mut verdicts = Vec::with_capacity(checks.len());
    while verdicts.len() < checks.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(verdict) => verdicts.push(Some(verdict)),
            Err(_) => break,
        }
    }
    verdicts.resize_with(checks.len(), || None);
    Ok(verdicts)
}
