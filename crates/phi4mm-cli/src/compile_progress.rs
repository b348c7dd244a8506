//! How the artifact cache's work shows on a terminal: a `compiling <entry> … 12.3 s` spinner
//! while a module compiles (compiles take minutes on the real checkpoint), and the event's line
//! (`CacheEvent`'s `Display`, the same line a server logs) when it ends, waits or rebuilds.
//! When stderr is not a terminal only rebuilds and failures are printed: a log reader needs
//! those, and a script piping the tool's output does not want the rest.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use switchyard_artifact_cache::{CacheEvent, Progress};

/// A [`Progress`] that draws on stderr.
pub fn terminal() -> Progress {
    let spinner: Mutex<Option<ProgressBar>> = Mutex::new(None);
    Progress::new(move |event| {
        let tty = std::io::stderr().is_terminal();
        match event {
            CacheEvent::Compiling { entry } => {
                *spinner.lock().unwrap_or_else(|p| p.into_inner()) = Some(start_spinner(entry));
                return;
            }
            CacheEvent::Compiled { .. } => {
                if let Some(bar) = spinner.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    bar.finish_and_clear();
                }
            }
            CacheEvent::Retrying { .. } => {
                // Mid-compile: printed above the spinner, which goes on.
                if let Some(bar) = &*spinner.lock().unwrap_or_else(|p| p.into_inner()) {
                    bar.suspend(|| eprintln!("{event}"));
                    return;
                }
            }
            CacheEvent::Waiting { .. } | CacheEvent::Rebuilding { .. } => {}
        }
        if tty || event.is_warning() {
            eprintln!("{event}");
        }
    })
}

fn start_spinner(entry: &str) -> ProgressBar {
    let style = ProgressStyle::with_template("{spinner} compiling {msg} … {secs}")
        .expect("valid template")
        .with_key("secs", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.1} s", s.elapsed().as_secs_f64());
        });
    // indicatif draws nothing when stderr is not a terminal.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        .with_style(style)
        .with_message(entry.to_owned());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}
