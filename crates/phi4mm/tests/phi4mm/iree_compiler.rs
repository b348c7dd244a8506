//! The compiler driver with the real `iree-compile`: a compile whose compiler stops using the CPU
//! is killed and run again, one that runs past the time limit is killed and is an error, a module the compiler rejects comes back with its diagnostics, and an
//! installation is run, never loaded into this process.
//!
//! Needs the toolchain: `. scripts/iree-env.sh` (exports PHI4MM_IREE_COMPILER).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use eerie::runtime::{BufferView, DeviceSpec, Runtime};
use switchyard_phi4mm::iree::compiler::IreeCompiler;
use switchyard_phi4mm::iree::IreeError;

/// `main(x) = x + x` on 8 f32, with a marker comment that tells this test's compile apart from
/// the compiles of the tests running beside it.
const MLIR: &str = r#"
// iree-compiler-test: stopped compile
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %x : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"#;
const MARKER: &str = "iree-compiler-test: stopped compile";

fn compiler() -> IreeCompiler {
    IreeCompiler::new(None, "host")
        .expect("IREE compiler library (source scripts/iree-env.sh for PHI4MM_IREE_COMPILER)")
}

/// The `iree-compile` children of this process compiling MLIR that holds `marker`.
fn compiles_of(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let parent = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1)?.parse::<u32>().ok());
            if !stat.contains("(iree-compile)") || parent != Some(me) {
                return false;
            }
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline
                .split(|b| *b == 0)
                .filter_map(|a| std::str::from_utf8(a).ok())
                .filter(|a| a.ends_with(".mlir"))
                .any(|a| {
                    std::fs::read_to_string(PathBuf::from(a))
                        .is_ok_and(|text| text.contains(marker))
                })
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok()
}

/// Waits (up to 120 s) for this process's first `iree-compile` child compiling MLIR that holds
/// `marker`, and stops it with SIGSTOP, as a deadlock would leave it: no CPU time from then on.
/// Returns its pid.
fn stop_first_compile_of(marker: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Some(&pid) = compiles_of(marker).first() {
            let ok = Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill -STOP {pid}");
            return pid;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no iree-compile child compiling the test's MLIR appeared in 120 s");
}

/// SIGSTOP on the compiler child, as a deadlock would leave it: no CPU time from then on. The
/// watchdog kills it after the stall limit and runs the compile again; that run is left alone,
/// and its module runs right.
#[test]
fn a_compile_whose_compiler_stops_is_killed_and_run_again() {
    let limit = Duration::from_secs(2);
    let c = compiler().with_stall_limit(limit);
    let retries: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());
    let (bytes, stopped_pid) = std::thread::scope(|s| {
        let stopper = s.spawn(|| stop_first_compile_of(MARKER));
        let bytes = c.compile_reporting(MLIR, &|attempt, why| {
            retries.lock().unwrap().push((attempt, why.to_owned()))
        });
        (bytes, stopper.join().unwrap())
    });
    let bytes = bytes.expect("the second run compiles");
    let retries = retries.into_inner().unwrap();
    assert_eq!(retries.len(), 1, "one retry: {retries:?}");
    assert_eq!(retries[0].0, 2, "the retry is run 2: {retries:?}");
    assert!(
        retries[0].1.contains("no CPU time for 2.0 s"),
        "the reason names the limit: {retries:?}"
    );
    assert!(
        !alive(stopped_pid),
        "the stopped compiler was killed and reaped"
    );

    let runtime = Runtime::new(DeviceSpec::local_sync()).unwrap();
    let program = runtime.load_vmfb(&bytes).unwrap();
    let f = program.function("module.main").unwrap();
    let x: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
    let xb = runtime.buffer_view(&[8], &x).unwrap();
    let out: BufferView<f32> = f.invoke_one([&xb]).unwrap();
    let want: Vec<f32> = x.iter().map(|v| v + v).collect();
    assert_eq!(out.read().unwrap(), want);
}

/// A compile that is still running at the time limit is killed and is an error at once, naming
/// the setting: unlike a stall it is not run again. The child is stopped here so that the compile
/// cannot finish first; its time limit (2 s) comes long before its stall limit (60 s), so what
/// kills it is the time it has run, not the CPU it has not used (the driver's unit tests show the
/// same for a child that computes without end).
#[test]
fn a_compile_that_runs_past_the_time_limit_is_killed_and_not_run_again() {
    const MARKER: &str = "iree-compiler-test: timed-out compile";
    let mlir = MLIR.replace("stopped compile", "timed-out compile");
    let c = compiler().with_time_limit(Duration::from_secs(2));
    let retried = Mutex::new(0);
    let t = Instant::now();
    let (result, stopped_pid) = std::thread::scope(|s| {
        let stopper = s.spawn(|| stop_first_compile_of(MARKER));
        let result = c.compile_reporting(&mlir, &|_, _| *retried.lock().unwrap() += 1);
        (result, stopper.join().unwrap())
    });
    let waited = t.elapsed();
    let err = result.expect_err("the stopped compile cannot finish");
    assert!(
        matches!(err, IreeError::CompileTimedOut { limit_s, .. } if limit_s == 2.0),
        "not a timeout: {err}"
    );
    let text = err.to_string();
    assert!(text.contains("iree.compile_timeout_secs"), "{text}");
    assert!(text.contains("2.0 s"), "{text}");
    assert_eq!(*retried.lock().unwrap(), 0, "a timeout is not retried");
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(50),
        "ended after {waited:?}, not at the 2 s limit (the stall limit is 60 s)"
    );
    assert!(!alive(stopped_pid), "the compiler was killed and reaped");
}

/// A module the compiler rejects is an error carrying the compiler's own diagnostic, and nothing
/// is retried: only a stall is.
#[test]
fn a_rejected_module_is_an_error_with_the_compilers_diagnostics() {
    let bad =
        "func.func @main(%x: tensor<8xf32>) -> tensor<4xf32> {\n  return %x : tensor<8xf32>\n}\n";
    let retried = Mutex::new(0);
    let err = compiler()
        .compile_reporting(bad, &|_, _| *retried.lock().unwrap() += 1)
        .expect_err("a return of the wrong type does not compile");
    let IreeError::Compile(text) = &err else {
        panic!("not a compile error: {err}");
    };
    assert!(text.contains("iree-compile failed"), "{text}");
    assert!(
        text.contains("error:"),
        "the compiler's diagnostic is kept: {text}"
    );
    assert!(text.contains("return"), "{text}");
    assert_eq!(*retried.lock().unwrap(), 0);
}

/// `main(x) = x + x`, compiled by the installations of the test below.
const PLAIN: &str = r#"
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.add %x, %x : tensor<8xf32>
  return %0 : tensor<8xf32>
}
"#;

/// The compiler is found, asked for its revision and run without its library ever being loaded
/// into this process (a server carried 56 MB of it for nothing), so one process may use
/// two installations. An installation is the library with `iree-compile` and `iree-lld` beside
/// it; one without its linker is refused up front, naming it, instead of failing every CPU
/// compile at the link.
#[test]
fn installations_are_run_not_loaded_and_need_their_tools() {
    use switchyard_phi4mm::iree::compiler::PACKAGE_VERSION;
    let first = compiler();
    let info = first.library_info();
    let (release, commit) = info
        .version()
        .split_once(" @ ")
        .unwrap_or_else(|| panic!("revision {:?}", info.version()));
    assert!(release.starts_with(PACKAGE_VERSION), "{release}");
    assert!(
        commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit}"
    );
    first
        .compile(PLAIN)
        .expect("the first installation compiles");

    // A second installation: the same three files, linked into a directory of their own.
    let source = info.path().parent().unwrap().to_owned();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for name in ["libIREECompiler.so", "iree-compile", "iree-lld"] {
        let to = dir.path().join(name);
        if std::fs::hard_link(source.join(name), &to).is_err() {
            std::fs::copy(source.join(name), &to).unwrap();
        }
    }
    let library = dir.path().join("libIREECompiler.so");
    let second = IreeCompiler::new(Some(&library), "host").expect("a second installation");
    assert_eq!(
        second.library_info().driver(),
        dir.path().join("iree-compile")
    );
    assert_eq!(second.library_info().version(), info.version());
    second
        .compile(PLAIN)
        .expect("the second installation compiles");

    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        !maps.contains("libIREECompiler"),
        "the compiler library is mapped into the test process"
    );

    // Without its linker, an installation is refused by name.
    let bare = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for name in ["libIREECompiler.so", "iree-compile"] {
        let to = bare.path().join(name);
        if std::fs::hard_link(dir.path().join(name), &to).is_err() {
            std::fs::copy(dir.path().join(name), &to).unwrap();
        }
    }
    let err = IreeCompiler::new(Some(&bare.path().join("libIREECompiler.so")), "host")
        .expect_err("an installation without iree-lld");
    let IreeError::CompilerTool { tool, .. } = &err else {
        panic!("not a missing tool: {err}");
    };
    assert_eq!(*tool, "iree-lld");
    assert!(err.to_string().contains("iree-lld"), "{err}");
}
