//! What starts a reload besides `POST /admin/reload`: SIGHUP, and (with `server.watch_config`)
//! a change to the config file. Both reload from the file, as the admin endpoint does.

use crate::runtime::Runtime;
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

/// SIGHUP's handler, installed before the first load: until a handler is there, a SIGHUP ends
/// the process (its default action), and a first load may take minutes. One that arrives
/// during the load waits in the stream, and reloads once serving starts. `None` (and a warning)
/// when it cannot be installed.
pub fn catch_sighup() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(hup) => Some(hup),
        Err(e) => {
            tracing::warn!(error = %e, "cannot install the SIGHUP handler; reload with POST /admin/reload");
            None
        }
    }
}

/// Starts the triggers the current config asks for: SIGHUP through `hup` (from
/// [`catch_sighup`]), and the config file's watch. They live as long as the tokio runtime.
pub fn spawn(
    runtime: &Arc<Runtime>,
    hup: Option<tokio::signal::unix::Signal>,
) -> notify::Result<()> {
    if let Some(hup) = hup {
        spawn_sighup_reloader(runtime.clone(), hup);
    }
    if runtime.current().config.server().watch_config {
        if let Some(path) = runtime.config_path().map(PathBuf::from) {
            spawn_config_watcher(runtime.clone(), path)?;
        }
    }
    Ok(())
}

fn spawn_sighup_reloader(runtime: Arc<Runtime>, mut hup: tokio::signal::unix::Signal) {
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the configuration");
            let _ = runtime.reload_from_file().await;
        }
    });
}

/// The symlink through which the kubelet publishes a ConfigMap volume: the config file is a
/// link through it, and an update swaps it by rename, leaving the file's own link untouched.
const KUBERNETES_DATA_LINK: &str = "..data";

/// Watches the config file's directory (editors replace files by rename, and the kubelet
/// swaps a ConfigMap's `..data` link) and reloads after the writes settle. A config path that
/// is a symlink into another directory has that directory watched too, for the file the link
/// pointed to at start: an edit of the target in place changes no entry beside the link.
fn spawn_config_watcher(runtime: Arc<Runtime>, path: PathBuf) -> notify::Result<()> {
    use notify::{RecursiveMode, Watcher};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let file_name = path.file_name().map(|n| n.to_os_string());
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    // Through a link to a file elsewhere: that file, and its directory. Not a kubelet volume's
    // link (`<file> -> ..data/<file>`): its target's directory is replaced by each update, which
    // the `..data` link beside the config path announces, and a watch there would fire again
    // when the kubelet deletes the old one.
    let through_kubelet_link =
        std::fs::read_link(&path).is_ok_and(|link| link.starts_with(KUBERNETES_DATA_LINK));
    let target = std::fs::canonicalize(&path).ok().filter(|t| {
        !through_kubelet_link && t.parent() != std::fs::canonicalize(&dir).ok().as_deref()
    });
    let target_dir = target
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    let target_in_event = target.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            let ours = |p: &PathBuf| {
                // In the target's directory only the target counts; beside the config path,
                // its name and the kubelet's link.
                if target_dir.is_some() && p.parent() == target_dir.as_deref() {
                    return target_in_event.as_ref() == Some(p);
                }
                let name = p.file_name().map(|n| n.to_os_string());
                name == file_name || name.as_deref() == Some(KUBERNETES_DATA_LINK.as_ref())
            };
            if changes_content(&event.kind) && event.paths.iter().any(ours) {
                let _ = tx.send(());
            }
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    if let Some(target_dir) = target.as_deref().and_then(Path::parent) {
        if let Err(e) = watcher.watch(target_dir, RecursiveMode::NonRecursive) {
            tracing::warn!(
                dir = %target_dir.display(),
                error = %e,
                "cannot watch the directory the config file links to; edits there reload only on SIGHUP"
            );
        }
    }
    tokio::spawn(async move {
        let _keep_alive = watcher;
        while rx.recv().await.is_some() {
            // Debounce: editors write in several steps.
            tokio::time::sleep(Duration::from_millis(300)).await;
            while rx.try_recv().is_ok() {}
            tracing::info!("config file changed: reloading");
            let _ = runtime.reload_from_file().await;
        }
    });
    Ok(())
}

/// Whether a watch event may have changed what the file holds. Opening and reading it may not:
/// the reload itself opens the file, and counting that as a change reloaded it again, without
/// end. A close after writing does (an editor that writes in place).
fn changes_content(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}
