//! The IREE artifact cache with real compiles (the `iree-compile` driver) and real loads (IREE
//! runtime): compile-once across threads and processes, takeover after SIGKILL, rebuild (never
//! load) on every kind of mismatch or corruption, (the `phi4mm cache` CLI is tested with the tool, in `crates/phi4mm-cli`).
//!
//! Needs the toolchain: `. scripts/iree-env.sh` (exports PHI4MM_IREE_COMPILER).

use artifact_cache::{
    ArtifactCache, CompilerIdentity, Identity, LoadedArtifact, ModuleRequest, WeightSpec,
};
use eerie::runtime::{BufferView, DeviceSpec, Runtime};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use switchyard_phi4mm::iree::compiler::IreeCompiler;

/// `main(x, w) = x·w + x` on 64×64 f32: a matmul and an add, so the module does real work.
const MLIR: &str = r#"
func.func @main(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
      : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %1 = stablehlo.add %0, %x : tensor<64x64xf32>
  return %1 : tensor<64x64xf32>
}
"#;
const N: usize = 64;
const CONFIG: &str = "test 64x64 f32 abi-1";

/// Env vars steering the re-executed test binary (see `child_*` tests).
const CHILD_MODE: &str = "IREE_CACHE_TEST_CHILD";
const CHILD_DIR: &str = "IREE_CACHE_TEST_DIR";
const CHILD_MARKER: &str = "IREE_CACHE_TEST_MARKER";

fn compiler() -> IreeCompiler {
    IreeCompiler::new(None, "host")
        .expect("IREE compiler library (source scripts/iree-env.sh for PHI4MM_IREE_COMPILER)")
}

fn weights() -> Vec<WeightSpec> {
    vec![WeightSpec::new("w", "f32", &[N, N])]
}

fn request<'a>(entry: &'a str, weights: &'a [WeightSpec]) -> ModuleRequest<'a> {
    ModuleRequest {
        entry,
        config_identity: CONFIG,
        mlir: MLIR,
        weights,
    }
}

fn load(cache: &ArtifactCache, c: &IreeCompiler, req: &ModuleRequest) -> LoadedArtifact {
    let id = c.identity(cache).unwrap();
    cache
        .load_or_compile(req, &id, |m| c.compile(m).map_err(|e| e.to_string()))
        .unwrap()
}

fn inputs() -> (Vec<f32>, Vec<f32>) {
    let x = (0..N * N).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect();
    let w = (0..N * N).map(|i| ((i * 3) % 5) as f32 - 2.0).collect();
    (x, w)
}

/// Loads the bytes into the IREE runtime, runs `module.main` and checks every element against a
/// plain Rust reference: "loads and runs" for real.
fn assert_runs(bytes: &[u8]) {
    let runtime = Runtime::new(DeviceSpec::local_sync()).unwrap();
    let program = runtime.load_vmfb(bytes).unwrap();
    let f = program.function("module.main").unwrap();
    let (x, w) = inputs();
    let xb = runtime.buffer_view(&[N, N], &x).unwrap();
    let wb = runtime.buffer_view(&[N, N], &w).unwrap();
    let out: BufferView<f32> = f.invoke_one([&xb, &wb]).unwrap();
    let out = out.read().unwrap();
    assert_eq!(out.len(), N * N);
    for i in 0..N {
        for j in 0..N {
            let want: f32 = (0..N).map(|k| x[i * N + k] * w[k * N + j]).sum::<f32>() + x[i * N + j];
            let got = out[i * N + j];
            assert!((got - want).abs() <= 1e-3, "[{i},{j}] {got} vs {want}");
        }
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn temps(dir: &Path) -> Vec<String> {
    files(dir)
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

fn with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|n| n.ends_with(ext) && n.contains(".main-"))
        .map(|n| dir.join(n))
        .collect()
}

fn only(paths: Vec<PathBuf>) -> PathBuf {
    assert_eq!(paths.len(), 1, "{paths:?}");
    paths.into_iter().next().unwrap()
}

#[test]
fn cold_cache_compiles_once_warm_cache_never() {
    let dir = tempfile::tempdir().unwrap();
    let c = compiler();
    let w = weights();
    let req = request("test.main", &w);

    let cold = ArtifactCache::open(dir.path()).unwrap();
    let first = load(&cold, &c, &req);
    assert!(first.compiled);
    assert_eq!(cold.compiles(), 1);
    let again = load(&cold, &c, &req);
    assert!(!again.compiled);
    assert_eq!(cold.compiles(), 1);
    assert_runs(&first.bytes);

    let warm = ArtifactCache::open(dir.path()).unwrap();
    let loaded = load(&warm, &c, &req);
    assert!(!loaded.compiled);
    assert_eq!(warm.compiles(), 0);
    assert_eq!(loaded.bytes, first.bytes);
    assert_eq!(loaded.manifest, first.manifest);
    assert_runs(&loaded.bytes);

    // What the manifest records is the request's identity.
    let m = &loaded.manifest;
    assert_eq!(m.identity.entry, "test.main");
    assert_eq!(m.identity.config_identity, CONFIG);
    assert_eq!(m.identity.weights, ["w:f32:64x64"]);
    assert_eq!(m.identity.compiler.flags, c.flags());
    assert!(m.identity.compiler.target_cpu.starts_with("host:"));
    assert_eq!(m.module_len, loaded.bytes.len() as u64);
    assert_eq!(
        files(dir.path()).len(),
        5,
        "module, manifest, lock, compiler-hash memo and its lock: {:?}",
        files(dir.path())
    );
}

#[test]
fn eight_threads_compile_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = compiler();
    let w = weights();
    let barrier = Barrier::new(8);
    // One ArtifactCache per thread: the exclusion must come from the file lock, which holds
    // between threads of one process as between processes.
    let results: Vec<(LoadedArtifact, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let cache = ArtifactCache::open(dir.path()).unwrap();
                    let id = c.identity(&cache).unwrap();
                    barrier.wait();
                    let a = cache
                        .load_or_compile(&request("test.main", &w), &id, |m| {
                            c.compile(m).map_err(|e| e.to_string())
                        })
                        .unwrap();
                    (a, cache.compiles())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total: u64 = results.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 1, "exactly one compile in total");
    assert_eq!(results.iter().filter(|(a, _)| a.compiled).count(), 1);
    for (a, _) in &results {
        assert_eq!(a.bytes, results[0].0.bytes);
    }
    assert_runs(&results[0].0.bytes);
    assert!(temps(dir.path()).is_empty());
}

/// Re-executes this test binary to run one `child_*` test in a fresh process.
fn child(test: &str, mode: &str, dir: &Path, marker: Option<&Path>) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_MODE, mode)
        .env(CHILD_DIR, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(m) = marker {
        cmd.env(CHILD_MARKER, m);
    }
    cmd
}

/// Child side of `two_processes_compile_once` and `sigkilled_compiler_is_taken_over`; returns at
/// once in a normal test run.
#[test]
fn child_loader() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    let dir = PathBuf::from(std::env::var_os(CHILD_DIR).unwrap());
    let c = compiler();
    let w = weights();
    let cache = ArtifactCache::open(&dir).unwrap();
    let id = c.identity(&cache).unwrap();
    let a = cache
        .load_or_compile(&request("test.main", &w), &id, |m| {
            let bytes = c.compile(m).map_err(|e| e.to_string())?;
            match mode.as_str() {
                // Widen the window in which the other process finds the entry being compiled.
                "load" => std::thread::sleep(Duration::from_millis(1500)),
                // Real compile done, lock held, module temp file open: tell the parent, then
                // wait to be SIGKILLed before publishing anything.
                "hang" => {
                    std::fs::write(std::env::var_os(CHILD_MARKER).unwrap(), b"compiled").unwrap();
                    std::thread::sleep(Duration::from_secs(600));
                    panic!("the parent should have killed this process");
                }
                other => panic!("unknown child mode {other}"),
            }
            Ok(bytes)
        })
        .unwrap();
    assert_runs(&a.bytes);
    println!("CHILD_COMPILES={}", cache.compiles());
}

fn child_compiles(out: std::process::Output) -> u64 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        // With --nocapture the line may follow the harness's "test child_loader ... ".
        .find_map(|l| l.split_once("CHILD_COMPILES=").map(|(_, n)| n))
        .unwrap_or_else(|| panic!("no count in child output: {stdout}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn two_processes_compile_once() {
    let dir = tempfile::tempdir().unwrap();
    let a = child("iree_cache::child_loader", "load", dir.path(), None)
        .spawn()
        .unwrap();
    let b = child("iree_cache::child_loader", "load", dir.path(), None)
        .spawn()
        .unwrap();
    let total = child_compiles(a.wait_with_output().unwrap())
        + child_compiles(b.wait_with_output().unwrap());
    assert_eq!(total, 1, "exactly one compile across both processes");
    let cache = ArtifactCache::open(dir.path()).unwrap();
    let v = cache.verify().unwrap();
    assert_eq!(v.len(), 1);
    assert!(v[0].1.is_ok());
    assert!(temps(dir.path()).is_empty());
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigkilled_compiler_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("child-compiled.marker");
    let mut owner = child(
        "iree_cache::child_loader",
        "hang",
        dir.path(),
        Some(&marker),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    wait_for("the child's compile", Duration::from_secs(300), || {
        marker.exists()
    });

    // The child holds the entry lock and has its module temp file open.
    let lock = only(with_ext(dir.path(), ".lock"));
    let probe = std::fs::File::open(&lock).unwrap();
    assert!(
        matches!(probe.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        "the child holds the lock"
    );
    drop(probe);
    let live_temps = temps(dir.path());
    assert_eq!(live_temps.len(), 1, "{:?}", files(dir.path()));

    // Opening the cache sweeps stale temps, but not the temp of a live writer.
    let cache = ArtifactCache::open(dir.path()).unwrap();
    assert_eq!(temps(dir.path()), live_temps);

    let c = compiler();
    let id = c.identity(&cache).unwrap();
    let w = weights();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            cache
                .load_or_compile(&request("test.main", &w), &id, |m| {
                    c.compile(m).map_err(|e| e.to_string())
                })
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(700));
        assert!(
            !waiter.is_finished(),
            "the waiter blocks while the owner lives"
        );
        owner.kill().unwrap(); // SIGKILL
        owner.wait().unwrap();
        let a = waiter.join().unwrap();
        assert!(a.compiled, "the waiter took over and compiled");
        assert_runs(&a.bytes);
    });
    assert_eq!(cache.compiles(), 1);
    assert!(
        temps(dir.path()).is_empty(),
        "dead writer's temp swept: {:?}",
        files(dir.path())
    );
    let v = cache.verify().unwrap();
    assert_eq!(v.len(), 1);
    assert!(v[0].1.is_ok());
}

/// Rewrites the manifest JSON; with `rekey`, also makes its key consistent with the edited
/// identity, so that only the comparison with the request can catch the edit.
fn tamper_manifest(path: &Path, rekey: bool, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    if rekey {
        let id: Identity = serde_json::from_value(v["identity"].clone()).unwrap();
        v["key"] = id.key().into();
    }
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// Builds the entry, damages it with `damage`, then checks that a fresh cache rebuilds it
/// (compiled, one compile, runs) and that the rebuilt entry is then loaded as is.
fn assert_damage_forces_rebuild(damage: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let c = compiler();
    let w = weights();
    let req = request("test.main", &w);
    let first = load(&ArtifactCache::open(dir.path()).unwrap(), &c, &req);
    assert!(first.compiled);
    damage(dir.path());

    let cache = ArtifactCache::open(dir.path()).unwrap();
    let rebuilt = load(&cache, &c, &req);
    assert!(
        rebuilt.compiled,
        "damaged entry must be rebuilt, never loaded"
    );
    assert_eq!(cache.compiles(), 1);
    assert_runs(&rebuilt.bytes);
    let after = ArtifactCache::open(dir.path()).unwrap();
    assert!(!load(&after, &c, &req).compiled);
    assert_eq!(after.compiles(), 0);
    assert!(after.verify().unwrap().iter().all(|(_, r)| r.is_ok()));
}

#[test]
fn flipped_module_byte_forces_rebuild() {
    assert_damage_forces_rebuild(|dir| {
        let module = only(with_ext(dir, ".vmfb"));
        let mut bytes = std::fs::read(&module).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x01;
        std::fs::write(&module, bytes).unwrap();
    });
}

#[test]
fn truncated_or_missing_manifest_forces_rebuild() {
    assert_damage_forces_rebuild(|dir| {
        let manifest = only(with_ext(dir, ".json"));
        let text = std::fs::read(&manifest).unwrap();
        std::fs::write(&manifest, &text[..text.len() / 2]).unwrap();
    });
    assert_damage_forces_rebuild(|dir| std::fs::remove_file(only(with_ext(dir, ".json"))).unwrap());
}

#[test]
fn manifest_from_another_compiler_version_forces_rebuild() {
    // At the request's own path, a (self-consistent) manifest claiming another compiler.
    assert_damage_forces_rebuild(|dir| {
        tamper_manifest(&only(with_ext(dir, ".json")), true, |v| {
            v["identity"]["compiler"]["version"] = "3.12.0".into();
        });
    });
    // Same, without fixing the key: rejected already by the manifest's self-check.
    assert_damage_forces_rebuild(|dir| {
        tamper_manifest(&only(with_ext(dir, ".json")), false, |v| {
            v["identity"]["compiler"]["version"] = "3.12.0".into();
        });
    });
}

#[test]
fn unknown_manifest_field_forces_rebuild() {
    assert_damage_forces_rebuild(|dir| {
        tamper_manifest(&only(with_ext(dir, ".json")), false, |v| {
            v["identity"]["compiler"]["note"] = "added by someone".into();
        });
    });
    assert_damage_forces_rebuild(|dir| {
        tamper_manifest(&only(with_ext(dir, ".json")), false, |v| {
            v["verified"] = true.into();
        });
    });
}

/// The request changes (compiler identity or weight schema) while the old entry stays valid:
/// the new request must compile, not load the old module.
fn assert_changed_request_rebuilds(
    changed_compiler: Option<IreeCompiler>,
    changed_identity: impl FnOnce(CompilerIdentity) -> CompilerIdentity,
    changed_weights: Option<Vec<WeightSpec>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let c = compiler();
    let w = weights();
    let cache = ArtifactCache::open(dir.path()).unwrap();
    assert!(load(&cache, &c, &request("test.main", &w)).compiled);

    let c2 = changed_compiler.unwrap_or_else(|| c.clone());
    let w2 = changed_weights.unwrap_or_else(|| w.clone());
    let id2 = changed_identity(c2.identity(&cache).unwrap());
    let a = cache
        .load_or_compile(&request("test.main", &w2), &id2, |m| {
            c2.compile(m).map_err(|e| e.to_string())
        })
        .unwrap();
    assert!(a.compiled, "changed identity must compile, never load");
    assert_eq!(cache.compiles(), 2);
    assert_runs(&a.bytes);
    assert_eq!(a.manifest.identity.compiler, id2);
    let v = cache.verify().unwrap();
    assert_eq!(v.len(), 2, "old and new entries side by side");
    assert!(v.iter().all(|(_, r)| r.is_ok()));
}

#[test]
fn changed_flag_forces_rebuild() {
    let c = compiler().with_extra_flags(["--iree-opt-const-eval=false".to_owned()]);
    assert_changed_request_rebuilds(Some(c), |id| id, None);
}

#[test]
fn other_compiler_version_forces_rebuild() {
    assert_changed_request_rebuilds(
        None,
        |mut id| {
            id.version.push_str("-next");
            id
        },
        None,
    );
}

#[test]
fn replaced_compiler_library_with_same_version_forces_rebuild() {
    // A rebuilt library reporting the same version string: only its hash differs.
    assert_changed_request_rebuilds(
        None,
        |mut id| {
            id.library_sha256 = artifact_cache::sha256_hex(b"another build");
            id
        },
        None,
    );
}

#[test]
fn changed_weight_schema_forces_rebuild() {
    let renamed = vec![WeightSpec::new("w_proj", "f32", &[N, N])];
    assert_changed_request_rebuilds(None, |id| id, Some(renamed));
}
