//! How the artifact cache's work shows on a terminal: a `compiling <entry> … 12.3 s` spinner
//! while a module compiles (compiles take minutes on the real checkpoint), and one line when an
//! entry is rebuilt or another process holds its lock. Nothing is drawn when stderr is not a
//! terminal, except the rebuild line, which an operator reading logs needs to see.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use artifact_cache::{CacheEvent, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// A [`Progress`] that draws on stderr.
pub fn terminal() -> Progress {
    let spinner: Mutex<Option<ProgressBar>> = Mutex::new(None);
    Progress::new(move |event| {
        let tty = std::io::stderr().is_terminal();
        match event {
            CacheEvent::Waiting { entry } if tty => {
                eprintln!("waiting for another process compiling {entry}")
            }
            CacheEvent::Waiting { .. } => {}
            CacheEvent::Rebuilding { entry, why } => {
                eprintln!("artifact cache: rebuilding {entry}: {why}")
            }
            CacheEvent::Compiling { entry } => {
                *spinner.lock().unwrap_or_else(|p| p.into_inner()) = Some(start_spinner(entry))
            }
            CacheEvent::Compiled { entry, elapsed, ok } => {
                if let Some(bar) = spinner.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    bar.finish_and_clear();
                }
                if tty && ok {
                    eprintln!("compiled {entry} in {:.1} s", elapsed.as_secs_f64());
                }
            }
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
