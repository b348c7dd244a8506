//! `phi4mm cache ls | verify | gc` on a cache holding a valid entry, a corrupted one and a stale
//! temp file. The tool manages plain files, so the entries are published through the real
//! `ArtifactCache` with a stand-in compile; real IREE compiles are tested in
//! `crates/phi4mm/tests/phi4mm/iree_cache.rs`.

use std::process::Command;

use switchyard_artifact_cache::{ArtifactCache, CompilerIdentity, LoadedArtifact, ModuleRequest};

/// An entry name as long as the real decoder's, longer than any fixed column would be.
const GOOD: &str = "decoder_l32_c4096_speech_vision.main";

fn compiler() -> CompilerIdentity {
    CompilerIdentity {
        library_sha256: "ab".repeat(32),
        version: "stand-in 1.2.3".into(),
        flags: vec!["--iree-hal-target-backends=llvm-cpu".into()],
        target_cpu: "generic".into(),
    }
}

fn load(cache: &ArtifactCache, entry: &str) -> LoadedArtifact {
    let req = ModuleRequest {
        entry,
        config_identity: "cli test",
        mlir: entry,
        weights: &[],
    };
    cache
        .load_or_compile(&req, &compiler(), |mlir| {
            Ok(mlir.bytes().cycle().take(256).collect())
        })
        .unwrap()
}

#[test]
fn cli_ls_verify_gc() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ArtifactCache::open(dir.path()).unwrap();
    let good = load(&cache, GOOD);
    let bad = load(&cache, "bad.main");
    let bad_module = dir
        .path()
        .join(format!("bad.main-{}.vmfb", bad.manifest.key));
    let mut bytes = std::fs::read(&bad_module).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&bad_module, bytes).unwrap();
    // A temp file left by a dead writer of the good entry.
    let stale = dir
        .path()
        .join(format!(".{GOOD}-{}~deadbeef.tmp", good.manifest.key));
    std::fs::write(&stale, b"partial").unwrap();

    let phi4mm = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_phi4mm"))
            .arg("cache")
            .args(args)
            .arg("--dir")
            .arg(dir.path())
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8(out.stdout).unwrap())
    };

    let (ok, ls) = phi4mm(&["ls"]);
    assert!(ok, "{ls}");
    assert!(ls.contains(GOOD) && ls.contains("bad.main"), "{ls}");
    assert!(ls.contains(&good.manifest.key[..16]), "{ls}");
    assert!(
        ls.contains(&good.manifest.identity.compiler.version),
        "{ls}"
    );
    assert!(ls.contains("2 entries"), "{ls}");
    // Columns as wide as their widest cell: every row's key starts under the header's KEY.
    let key_column = ls.lines().next().and_then(|header| header.find("KEY"));
    for (row, key) in [(GOOD, &good.manifest.key), ("bad.main", &bad.manifest.key)] {
        let line = ls.lines().find(|l| l.starts_with(row)).unwrap();
        assert_eq!(line.find(&key[..16]), key_column, "{ls}");
    }

    let (ok, verify) = phi4mm(&["verify"]);
    assert!(!ok, "an invalid entry makes verify fail: {verify}");
    assert!(
        verify.contains(&format!("ok       {GOOD}-{}", good.manifest.key)),
        "{verify}"
    );
    assert!(
        verify.contains(&format!("INVALID  bad.main-{}", bad.manifest.key)),
        "{verify}"
    );

    let (ok, gc) = phi4mm(&["gc"]);
    assert!(ok, "{gc}");
    assert!(gc.contains("stale temp file"), "{gc}");
    assert!(
        gc.contains(&format!("bad.main-{}.vmfb", bad.manifest.key)),
        "{gc}"
    );
    assert!(
        gc.contains(&format!("bad.main-{}.json", bad.manifest.key)),
        "{gc}"
    );
    assert!(
        gc.lines()
            .filter(|l| l.contains(&format!("{GOOD}-")))
            .all(|l| l.contains("~deadbeef.tmp")),
        "the good entry stays: {gc}"
    );
    assert!(!stale.exists());

    let (ok, verify) = phi4mm(&["verify"]);
    assert!(ok, "{verify}");
    assert!(verify.contains("1 entries, 0 invalid"), "{verify}");
    let again = load(&ArtifactCache::open(dir.path()).unwrap(), GOOD);
    assert!(!again.compiled, "gc kept the valid entry");
    assert_eq!(
        again.bytes, good.bytes,
        "and its module bytes are unchanged"
    );
}

/// `phi4mm cache warm` puts every module an instance with those settings loads into the cache,
/// compiling without creating a device; a second run finds them all, and `ls` lists them.
#[cfg(feature = "iree")]
#[test]
fn cli_warm_compiles_every_module_once() {
    let dir = tempfile::tempdir().unwrap();
    let warm = || {
        let out = Command::new(env!("CARGO_BIN_EXE_phi4mm"))
            .args([
                "cache",
                "warm",
                "--iree-device",
                "local-sync",
                "--iree-context",
                "256",
            ])
            .arg("--model")
            .arg(switchyard_fixtures::fixture().join("model"))
            .arg("--iree-cache-dir")
            .arg(dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        let modules: Vec<(String, bool)> = line["modules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let entry = m["entry"].as_str().unwrap().to_owned();
                (entry, m["compiled"].as_bool().unwrap())
            })
            .collect();
        assert_eq!(line["device"], "local-sync", "{line}");
        modules
    };
    let entries = |compiled: bool| ["decoder", "vision", "audio"].map(|e| (e.to_owned(), compiled));
    assert_eq!(warm(), entries(true), "a cold cache compiles every module");
    assert_eq!(warm(), entries(false), "a warm one compiles none");

    let ls = Command::new(env!("CARGO_BIN_EXE_phi4mm"))
        .args(["cache", "ls", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let ls = String::from_utf8(ls.stdout).unwrap();
    assert!(ls.contains("3 entries"), "{ls}");
}
