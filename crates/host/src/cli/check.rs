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
    let manifest: serde_json::Value = serde_json::from_str(&text)?;
    let verdict = match load_as_serving_would("inspected", &file)? {
        Ok(label) => serde_json::json!({"compatible": true, "loaded_as": label}),
        Err(reason) => serde_json::json!({"compatible": false, "reason": reason}),
    };
    let out = serde_json::json!({
        "file": file, "sha256": sha256, "manifest": manifest,
        "host_api_version": switchyard_plugin_api::API_VERSION.to_string(), "check": verdict,
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
    let (mut checked, mut unchecked) = (0, Vec::new());
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
                    // The plugin's own check of what it would be created from.
                    match registry::check_settings(
                        &plugin.path,
                        &model.kind,
                        &model.settings,
                        config.base_dir(),
                    ) {
                        Ok(SettingsVerdict::Accepted) => checked += 1,
                        Ok(SettingsVerdict::Refused(why)) => {
                            problems.push(format!("models[{j}].settings ({}): {why}", model.name))
                        }
                        Ok(SettingsVerdict::NotChecked) => unchecked.push(format!(
                            "models[{j}].settings ({}): not checked: plugin {} (API {}) \
                             exports no settings check; they are checked when the instance is \
                             created",
                            model.name, plugin.name, manifest.api_version
                        )),
                        Err(e) => problems.push(format!("plugins[{i}].path: {e}")),
                    }
                }
            }
        }
    }
    for note in &unchecked {
        eprintln!("note: {note}");
    }
    if problems.is_empty() {
        println!(
            "{}: ok ({} plugins, {} models, {} routes; settings checked by their plugin for \
             {checked} of {} models)",
            file.display(),
            config.plugins().len(),
            config.models().len(),
            config.routes().len(),
            config.models().len(),
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
