//! The `phi4mm` tool as a user runs it: the real binary, on the fixture checkpoint.

use std::process::{Command, Output};

mod batch;
mod bench_batch;
mod cache;
mod frontend;
mod generate;
mod refusals;

/// Runs a `phi4mm` command to completion and asserts that it succeeded, showing its stderr when
/// it did not.
fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A command's stdout as its one JSON line.
fn json_line(out: &Output) -> serde_json::Value {
    let stdout = std::str::from_utf8(&out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}
