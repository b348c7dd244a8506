//! Each compile runs `iree-compile`, the driver that iree-base-compiler ships beside
//! `libIREECompiler.so`, as a child process under a stall watchdog.
//!
//! Why not the library in this process: IREE 3.13's compiler can deadlock inside a compile. The
//! codegen dialect parses a tuning spec while holding a mutex. The parse verifies in parallel on
//! MLIR's thread pool, and a pool thread that waits for its tasks runs whatever task is queued
//! first, which can be another executable's compile asking for the same mutex. That thread then
//! waits on itself forever (the pattern of iree-org/iree#22842). It was seen once in CI, in the
//! decoder's compile. In this process such a compile would keep a thread and its cache entry's
//! lock until a restart. A child can be killed and its compile run again. A compiler crash (an LLVM
//! fatal error aborts) also ends the child, not the server.
//!
//! A stalled compile is told from a slow one by CPU time: a compile is CPU-bound throughout, and a
//! deadlocked one uses none. A child whose CPU time has not moved for [`STALL_LIMIT`] is killed;
//! the compile is tried [`ATTEMPTS`] times in all. A compile that keeps using CPU without ending
//! (a loop in a pass) is not a stall; the time limit ([`TIME_LIMIT`] unless the operator sets
//! another) ends it, once, for a loop is not a race and running it again would loop again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::super::error::{IreeError, Result};

/// How long a compile may use no CPU time before it is taken for deadlocked and killed. No phase
/// of a compile waits on anything but the CPU, so even a starved compile on a loaded machine
/// moves its CPU time within a second. The one wait is the link: the driver runs `iree-lld` once
/// per module and waits for it, and that time is the linker's, not the driver's; it took 85 ms
/// for the tiny checkpoint's audio encoder (`strace -f` of a compile).
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// How long one compile may run in all before it is killed, unless the operator sets another
/// limit (`iree.compile_timeout_secs`). The longest compile measured, the released model's decoder
/// at its full context on 2 vCPUs, took about 17 minutes (`docs/deploy.md`); an hour leaves a
/// machine half as fast room for it, and still ends a runaway compile.
pub const TIME_LIMIT: Duration = Duration::from_secs(crate::config::DEFAULT_COMPILE_TIMEOUT_SECS);

/// The limits one run of the driver is watched against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// How long its CPU time may stay still ([`STALL_LIMIT`]).
    pub stall: Duration,
    /// How long it may run in all ([`TIME_LIMIT`]).
    pub time: Duration,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            stall: STALL_LIMIT,
            time: TIME_LIMIT,
        }
    }
}

/// Why the watchdog killed a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    /// Its CPU time stood still for the stall limit.
    Stalled,
    /// It ran for the time limit.
    TimedOut,
}

/// How many times a compile is run before a stall is an error. The deadlock is a race, so the next
/// run almost always completes.
pub const ATTEMPTS: u32 = 3;

/// The driver's file name, in the compiler library's directory.
const DRIVER: &str = "iree-compile";

/// The linker the driver runs for every CPU module (it looks beside itself first; a compile
/// without it fails at the link, after all the codegen).
const LINKER: &str = "iree-lld";

/// What precedes the revision in `iree-compile --version`.
const VERSION_LINE: &str = "IREE compiler version";

/// The revision in the output of `iree-compile --version`.
fn revision_of(version_output: &str) -> Option<String> {
    version_output.lines().find_map(|line| {
        let revision = line.trim().strip_prefix(VERSION_LINE)?.trim();
        (!revision.is_empty()).then(|| revision.to_owned())
    })
}

/// How much of the driver's diagnostics an error keeps: the start, where MLIR puts a
/// diagnostic's `error:` line (the IR it prints after it runs to many kilobytes: `sm_90` on the
/// pinned compiler gave 16 KiB that began mid-IR), and the end, where a crash's trace is.
const STDERR_HEAD: usize = 2 * 1024;
const STDERR_TAIL: usize = 14 * 1024;

/// The `iree-compile` beside a compiler library.
#[derive(Debug, Clone)]
pub struct Driver {
    path: PathBuf,
}

/// How one run of the driver ended, other than with a module.
#[derive(Debug)]
pub enum RunFailure {
    /// Killed after using no CPU time for the stall limit.
    Stalled,
    /// Killed after running for the time limit.
    TimedOut,
    /// It failed: its exit status and the end of its diagnostics.
    Failed(String),
}

impl Driver {
    /// The driver beside `library`; an error if it, or the linker it runs, is not there.
    pub fn beside(library: &Path) -> Result<Self> {
        let dir = library.parent().unwrap_or(Path::new("."));
        for tool in [DRIVER, LINKER] {
            let path = dir.join(tool);
            if !path.is_file() {
                return Err(IreeError::CompilerTool {
                    tool,
                    path,
                    library: library.to_owned(),
                });
            }
        }
        Ok(Driver {
            path: dir.join(DRIVER),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The compiler's revision, as `iree-compile --version` prints it after "IREE compiler
    /// version" (`3.13.0rc20261016 @ 89ece87…`): the same string the library's
    /// `ireeCompilerGetRevision` answers, so module caches keyed by it before stay valid.
    pub fn version(&self) -> Result<String> {
        let failed = |why: String| {
            IreeError::CompilerRevision(format!("{} --version: {why}", self.path.display()))
        };
        let output = Command::new(&self.path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed(e.to_string()))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(failed(format!(
                "{}: {}",
                describe(output.status),
                stderr.trim_end()
            )));
        }
        revision_of(&stdout).ok_or_else(|| {
            failed(format!(
                "no \"{VERSION_LINE}\" line in its output: {}",
                stdout.trim_end()
            ))
        })
    }

    /// Compiles `mlir` with `flags` (and a tuning spec's text, if any) to a VM flatbuffer. Every
    /// file lives in a private temporary directory, removed when the run ends.
    pub fn run(
        &self,
        mlir: &str,
        flags: &[String],
        tuning_spec: Option<&str>,
        limits: RunLimits,
    ) -> Result<Vec<u8>, RunFailure> {
        let io = |what: &str, e: std::io::Error| RunFailure::Failed(format!("{what}: {e}"));
        let dir = tempfile::Builder::new()
            .prefix("phi4mm-compile-")
            .tempdir()
            .map_err(|e| io("creating the compile's temporary directory", e))?;
        let input = dir.path().join("input.mlir");
        let output = dir.path().join("module.vmfb");
        std::fs::write(&input, mlir).map_err(|e| io("writing the MLIR", e))?;
        let mut command = Command::new(&self.path);
        command.args(flags);
        if let Some(spec) = tuning_spec {
            let path = dir.path().join("tuning-spec.mlir");
            std::fs::write(&path, spec).map_err(|e| io("writing the tuning spec", e))?;
            command.arg(format!("{}={}", super::TUNING_SPEC, path.display()));
        }
        command.arg(&input).arg("-o").arg(&output);
        let run = run_watched(command, limits)
            .map_err(|e| io(&format!("starting {}", self.path.display()), e))?;
        match run.killed {
            Some(Killed::Stalled) => return Err(RunFailure::Stalled),
            Some(Killed::TimedOut) => return Err(RunFailure::TimedOut),
            None => {}
        }
        if !run.status.success() {
            return Err(RunFailure::Failed(format!(
                "{} {}:\n{}",
                self.path.display(),
                describe(run.status),
                run.stderr_tail.trim_end()
            )));
        }
        std::fs::read(&output).map_err(|e| io("reading the compiled module", e))
    }
}

/// The words for how a child ended: its exit code, or the signal that ended it.
fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    format!("failed ({status})")
}

/// A child's end, as [`run_watched`] saw it.
#[derive(Debug)]
pub struct Watched {
    pub status: ExitStatus,
    /// Whether the watchdog killed it, and why.
    pub killed: Option<Killed>,
    /// The first [`STDERR_HEAD`] and the last [`STDERR_TAIL`] bytes it wrote to stderr.
    pub stderr_tail: String,
}

/// Runs `command` (stdout discarded, stderr kept) and kills it if its CPU time stays still for
/// `limits.stall` or it runs for `limits.time`. On Linux the child also dies with the thread that started it, so a server
/// killed mid-compile leaves no compiler running. Where `/proc` cannot be read, nothing is taken
/// for a stall.
pub fn run_watched(mut command: Command, limits: RunLimits) -> std::io::Result<Watched> {
    command.stdin(Stdio::null()).stdout(Stdio::null());
    command.stderr(Stdio::piped());
    die_with_parent(&mut command);
    let mut child = command.spawn()?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let reader = thread::spawn(move || head_and_tail(stderr, STDERR_HEAD, STDERR_TAIL));
    let (status, killed) = watch(&mut child, limits)?;
    let stderr_tail = reader.join().unwrap_or_default();
    Ok(Watched {
        status,
        killed,
        stderr_tail,
    })
}

/// Waits for `child`, killing it when its CPU time has not moved for `limits.stall` or when it has
/// run for `limits.time`.
fn watch(child: &mut Child, limits: RunLimits) -> std::io::Result<(ExitStatus, Option<Killed>)> {
    let poll = (limits.stall.min(limits.time) / 8)
        .clamp(Duration::from_millis(20), Duration::from_millis(500));
    let started = Instant::now();
    let mut cpu = cpu_ticks(child.id());
    let mut moved = started;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok((status, None));
        }
        thread::sleep(poll);
        let now = cpu_ticks(child.id());
        let killed = if started.elapsed() >= limits.time {
            Some(Killed::TimedOut)
        } else if now.is_none() || now != cpu {
            cpu = now;
            moved = Instant::now();
            None
        } else if moved.elapsed() >= limits.stall {
            Some(Killed::Stalled)
        } else {
            None
        };
        if let Some(killed) = killed {
            // An error here means it just exited; `wait` collects it either way.
            let _ = child.kill();
            return Ok((child.wait()?, Some(killed)));
        }
    }
}

/// A process's CPU time so far in clock ticks (user + system, every thread), from
/// `/proc/<pid>/stat`; `None` where that cannot be read.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces: the state is
    // field 3 of proc(5), so utime (14) and stime (15) are the 12th and 13th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// Reads `from` to its end, keeping its first `head` and last `keep` bytes as text, with a line
/// that says how much was left out between them.
fn head_and_tail(mut from: impl std::io::Read, head: usize, keep: usize) -> String {
    let (mut first, mut kept, mut left_out) = (Vec::new(), Vec::new(), 0usize);
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let to_head = (head - first.len()).min(n);
                first.extend_from_slice(&buf[..to_head]);
                kept.extend_from_slice(&buf[to_head..n]);
                if kept.len() > 2 * keep {
                    left_out += kept.len() - keep;
                    kept.drain(..kept.len() - keep);
                }
            }
        }
    }
    if kept.len() > keep {
        left_out += kept.len() - keep;
        kept.drain(..kept.len() - keep);
    }
    if left_out == 0 {
        // Whole: decoded as one, so no character is split at the head's end.
        first.extend_from_slice(&kept);
        return String::from_utf8_lossy(&first).into_owned();
    }
    format!(
        "{}\n[… {left_out} bytes left out …]\n{}",
        String::from_utf8_lossy(&first),
        String::from_utf8_lossy(&kept)
    )
}

/// On Linux, asks the kernel to kill the child when the thread that spawned it ends: that thread
/// waits for the child, so it ends first only when the whole process dies.
fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_is_read_from_the_version_output() {
        // iree-base-compiler 3.13.0's `iree-compile --version`, verbatim.
        let output = "IREE (https://iree.dev):\n  IREE compiler version 3.13.0rc20261016 @ \
                      89ece87b89852100c0a4ac3d515e14842d090967\n  LLVM version 24.0.0git\n  \
                      Optimized build\n";
        assert_eq!(
            revision_of(output).as_deref(),
            Some("3.13.0rc20261016 @ 89ece87b89852100c0a4ac3d515e14842d090967")
        );
        assert_eq!(
            revision_of("IREE (https://iree.dev):\n  LLVM version 24\n"),
            None
        );
        assert_eq!(revision_of("IREE compiler version   \n"), None);
    }

    /// A child that sleeps uses no CPU time: the watchdog kills it after the limit, long before it
    /// would have ended.
    #[test]
    fn a_child_using_no_cpu_is_killed_after_the_limit() {
        let mut sleep = Command::new("sleep");
        sleep.arg("60");
        let t = Instant::now();
        let limits = RunLimits {
            stall: Duration::from_millis(600),
            ..RunLimits::default()
        };
        let run = run_watched(sleep, limits).unwrap();
        assert_eq!(run.killed, Some(Killed::Stalled), "{run:?}");
        assert!(!run.status.success(), "{run:?}");
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(600) && waited < Duration::from_secs(20),
            "killed after {waited:?}"
        );
    }

    /// A child that computes for longer than the limit is not taken for stalled, and its stderr
    /// comes back.
    #[test]
    fn a_busy_child_outlives_the_limit() {
        let mut busy = Command::new("sh");
        busy.args([
            "-c",
            "i=0; while [ $i -lt 1500000 ]; do i=$((i+1)); done; echo done-counting >&2; exit 3",
        ]);
        let t = Instant::now();
        let limit = Duration::from_millis(800);
        let limits = RunLimits {
            stall: limit,
            ..RunLimits::default()
        };
        let run = run_watched(busy, limits).unwrap();
        assert_eq!(run.killed, None, "{run:?} after {:?}", t.elapsed());
        assert_eq!(run.status.code(), Some(3), "{run:?}");
        assert_eq!(run.stderr_tail.trim(), "done-counting");
        assert!(
            t.elapsed() > limit,
            "the busy loop ended within the limit ({:?}), so this shows nothing",
            t.elapsed()
        );
    }

    /// A child that computes forever is no stall, but the time limit ends it.
    #[test]
    fn a_child_that_never_ends_is_killed_at_the_time_limit() {
        let mut spin = Command::new("sh");
        spin.args(["-c", "while :; do :; done"]);
        let limits = RunLimits {
            stall: Duration::from_millis(300),
            time: Duration::from_millis(1500),
        };
        let t = Instant::now();
        let run = run_watched(spin, limits).unwrap();
        let waited = t.elapsed();
        assert_eq!(run.killed, Some(Killed::TimedOut), "{run:?}");
        assert!(!run.status.success(), "{run:?}");
        assert!(
            waited >= limits.time && waited < Duration::from_secs(20),
            "killed after {waited:?}"
        );
    }

    #[test]
    fn the_diagnostics_keep_their_start_and_end() {
        let text: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let kept = head_and_tail(&text[..], 100, 1000);
        let start = std::str::from_utf8(&text[..100]).unwrap();
        let end = std::str::from_utf8(&text[text.len() - 1000..]).unwrap();
        assert_eq!(
            kept,
            format!("{start}\n[… {} bytes left out …]\n{end}", 100_000 - 1100)
        );
        assert_eq!(head_and_tail(&b"short"[..], 100, 1000), "short");
        // Nothing left out, with a character across the head's end.
        let whole = format!("{}é{}", "a".repeat(99), "b".repeat(900));
        assert_eq!(head_and_tail(whole.as_bytes(), 100, 1000), whole);
    }

    #[test]
    fn cpu_ticks_reads_this_process() {
        if cfg!(target_os = "linux") {
            let busy_until = Instant::now() + Duration::from_millis(50);
            while Instant::now() < busy_until {}
            assert!(cpu_ticks(std::process::id()).unwrap() > 0);
        }
    }
}
