//! The `switchyard` command line: `plugins inspect`, `config check`, `run`.

use std::process::Command;
use switchyard_fixtures::fixture;
use switchyard_integration_tests::{free_port, phi4mm_lib, plugin_lib, switchyard_bin, TempDir};

fn switchyard(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(switchyard_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn inspect_describes_compatible_and_incompatible_plugins() {
    let echo = plugin_lib("echo_v2");
    let (ok, out, err) = switchyard(&["plugins", "inspect", echo.to_str().unwrap()]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["manifest"]["name"], "echo");
    assert_eq!(v["manifest"]["version"], "2.0.0");
    assert_eq!(v["manifest"]["models"][0]["chat_modalities"][0], "text");
    assert_eq!(v["check"]["compatible"], true);
    assert_eq!(v["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(v["settings_check"], true, "{v}");

    // Built against API 2.0, before the settings check.
    let old = plugin_lib("echo_2_0");
    let (ok, out, err) = switchyard(&["plugins", "inspect", old.to_str().unwrap()]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["check"]["compatible"], true, "{v}");
    assert_eq!(v["settings_check"], false, "{v}");

    let bad = plugin_lib("incompatible");
    let (ok, out, err) = switchyard(&["plugins", "inspect", bad.to_str().unwrap()]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["manifest"]["name"], "incompatible",
        "described from the JSON symbol"
    );
    assert_eq!(v["check"]["compatible"], false);
    assert!(
        v["check"]["reason"]
            .as_str()
            .unwrap()
            .contains("type layouts differ"),
        "{v}"
    );
}

#[test]
fn config_check_accepts_good_and_names_bad_keys() {
    let dir = TempDir::new("cli");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        format!(
            "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\n",
            plugin_lib("echo").display()
        ),
    )
    .unwrap();
    let (ok, out, err) = switchyard(&["config", "check", good.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "ok (1 plugin, 1 model, 0 routes; settings checked by their plugin for 1 of 1)"
        ),
        "{out}"
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        format!(
            "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"parrot\"\n",
            plugin_lib("echo").display()
        ),
    )
    .unwrap();
    let (ok, _, err) = switchyard(&["config", "check", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("models[0].kind"), "{err}");

    // Environment overrides apply and are validated too.
    let out = Command::new(switchyard_bin())
        .args(["config", "check", good.to_str().unwrap()])
        .env("SWITCHYARD__SERVER__LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.listen"));

    // A value is text until the key's type says otherwise: an all-digit token (a Secret's, say)
    // keeps its leading zero and its length, and numbers and flags still read as such.
    for token in ["0123456789012345", "12345678901234567890123456"] {
        let out = Command::new(switchyard_bin())
            .args(["config", "check", good.to_str().unwrap()])
            .env("SWITCHYARD__SERVER__ADMIN_TOKEN", token)
            .env("SWITCHYARD__SERVER__DRAIN_TIMEOUT_SECS", "2.5")
            .env("SWITCHYARD__SERVER__WATCH_CONFIG", "true")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "token {token}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new(switchyard_bin())
        .args(["config", "check", good.to_str().unwrap()])
        .env("SWITCHYARD__SERVER__MAX_BODY_BYTES", "-3")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.max_body_bytes"));
}

#[test]
fn config_check_gives_the_settings_checks_the_reload_timeout() {
    // A check that hangs (a checkpoint on a hung mount) fails `config check` at
    // reload_timeout_secs, as it would fail the reload, and the checks that answered keep their
    // verdicts.
    let dir = TempDir::new("cli-check-timeout");
    let path = dir.path().join("slow.toml");
    let text = format!(
        "[server]\nreload_timeout_secs = 1\n{}",
        models_config(
            &plugin_lib("echo"),
            "echo",
            &["slots = 0", "check_delay_ms = 60000", "slots = 2"]
        )
    );
    std::fs::write(&path, text).unwrap();
    let started = std::time::Instant::now();
    let (ok, out, err) = switchyard(&["config", "check", path.to_str().unwrap()]);
    let took = started.elapsed();
    assert!(!ok, "{out}");
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    for needle in [
        "models[0].settings (m0): slots must be at least 1",
        "models[1].settings (m1): the plugin's settings check did not finish within \
         reload_timeout_secs = 1",
        "models[2].settings (m2): not checked: the check of models[1] before it did not finish",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
}

/// A config whose models all use the plugin at `lib`, one per settings table.
fn models_config(lib: &std::path::Path, kind: &str, settings: &[&str]) -> String {
    let mut text = format!("[[plugins]]\nname = \"p\"\npath = \"{}\"\n", lib.display());
    for (i, settings) in settings.iter().enumerate() {
        text += &format!(
            "[[models]]\nname = \"m{i}\"\nplugin = \"p\"\nkind = \"{kind}\"\nsettings = {{ {settings} }}\n"
        );
    }
    text
}

#[test]
fn config_check_has_each_plugin_check_its_models_settings() {
    let dir = TempDir::new("cli-settings");
    let check = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        switchyard(&["config", "check", path.to_str().unwrap()])
    };
    let echo = plugin_lib("echo");

    // Every refusal is named by its model, with the plugin's reason; a good model passes.
    let (ok, out, err) = check(
        "echo.toml",
        models_config(
            &echo,
            "echo",
            &[
                "slots = 2",
                "slots = 0",
                "slot = 2",
                "token_delay_ms = \"slow\"",
            ],
        ),
    );
    assert!(!ok, "{out}");
    for needle in [
        "models[1].settings (m1): slots must be at least 1",
        "models[2].settings (m2): settings.slot: unknown field `slot`",
        "models[3].settings (m3): settings.token_delay_ms: invalid type: string \"slow\"",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert!(!err.contains("models[0]"), "{err}");

    // A panic in a plugin's check is a refusal, and the command still answers for the rest.
    let (ok, _, err) = check(
        "panic.toml",
        models_config(&echo, "echo", &["panic_on_check = true", "slots = 0"]),
    );
    assert!(!ok);
    assert!(
        err.contains(
            "models[0].settings (m0): plugin panicked in check_settings: panic_on_check is set"
        ),
        "{err}"
    );
    assert!(err.contains("models[1].settings (m1)"), "{err}");

    // A plugin whose ABI the host refuses is refused here too, as `serve` would, and nothing
    // of it is called.
    let (ok, _, err) = check(
        "incompatible.toml",
        models_config(&plugin_lib("incompatible"), "echo", &["slots = 2"]),
    );
    assert!(!ok);
    assert!(
        err.contains("plugins[0].path: plugin \"p\"") && err.contains("incompatible ABI"),
        "{err}"
    );

    // A plugin built before API 2.2 has no check: noted, not failed.
    let (ok, out, err) = check(
        "old.toml",
        models_config(&plugin_lib("echo_2_0"), "echo", &["slots = 0"]),
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("settings checked by their plugin for 0 of 1)"),
        "{out}"
    );
    assert!(
        err.contains("models[0].settings (m0): not checked: plugin p (API 2.0)"),
        "{err}"
    );

    // Phi4MM opens the checkpoint's config, tensor headers and tokenizer, with relative paths
    // starting from the config's directory, as when it serves.
    let phi4mm = phi4mm_lib();
    std::fs::create_dir_all(dir.path().join("ckpt")).unwrap();
    let copy = dir.path().join("ckpt/model");
    std::os::unix::fs::symlink(fixture().join("model"), &copy).unwrap();
    let (ok, out, err) = check(
        "phi4mm.toml",
        models_config(&phi4mm, "phi4mm", &["checkpoint = \"ckpt/model\""]),
    );
    assert!(ok, "{err}");
    assert!(out.contains("for 1 of 1)"), "{out}");
    let (ok, _, err) = check(
        "phi4mm-bad.toml",
        models_config(
            &phi4mm,
            "phi4mm",
            &[
                "checkpoint = \"ckpt/nowhere\"",
                "checkpoint = \"ckpt/model\", slots = 0",
                "checkpoint = \"ckpt/model\", backend = \"tpu\"",
                "checkpoint = \"ckpt/model\", slots = 100000000",
                "checkpoint = \"ckpt/model\", threads = 5000",
                "checkpoint = \"ckpt/model\", backend = \"iree\", iree = { compiler = \"/nowhere/libIREECompiler.so\" }",
            ],
        ),
    );
    assert!(!ok);
    let nowhere = format!(
        "models[0].settings (m0): checkpoint {}",
        dir.path().join("ckpt/nowhere").display()
    );
    for needle in [
        nowhere.as_str(),
        "models[1].settings (m1): slots must be in 1..=1024",
        "models[2].settings (m2)",
        "unknown variant `tpu`",
        "models[3].settings (m3): slots must be in 1..=1024",
        "models[4].settings (m4): threads and media_threads must be in 1..=1024",
        // As `serve` would refuse it: the IREE compiler is looked for (in a build without
        // the backend, the backend itself is refused).
        "models[5].settings (m5)",
        if cfg!(feature = "iree") {
            "/nowhere/libIREECompiler.so"
        } else {
            "has no IREE backend"
        },
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }

    // A checkpoint whose tensor headers contradict its config is refused without its values
    // being read: a LoRA pair missing its B.
    let broken = dir.path().join("ckpt/broken");
    copy_dir(&fixture().join("model"), &broken);
    drop_tensor_named(
        &broken.join("speech-lora/adapter_model.safetensors"),
        "lora_B",
    );
    let (ok, _, err) = check(
        "phi4mm-broken.toml",
        models_config(&phi4mm, "phi4mm", &["checkpoint = \"ckpt/broken\""]),
    );
    assert!(!ok);
    assert!(err.contains("models[0].settings (m0): checkpoint"), "{err}");
    assert!(err.contains("lora_B"), "{err}");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Rewrites a safetensors file without its first tensor whose name contains `needle`, the
/// others' bytes packed again as the format requires.
fn drop_tensor_named(path: &std::path::Path, needle: &str) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let name = header
        .keys()
        .find(|k| k.contains(needle))
        .unwrap_or_else(|| panic!("no tensor named like {needle} in {}", path.display()))
        .clone();
    let data = &bytes[8 + n..];
    let (mut kept, mut packed) = (serde_json::Map::new(), Vec::new());
    for (key, mut entry) in header.into_iter().filter(|(k, _)| *k != name) {
        if key != "__metadata__" {
            let [begin, end] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().unwrap() as usize);
            entry["data_offsets"] = serde_json::json!([packed.len(), packed.len() + end - begin]);
            packed.extend_from_slice(&data[begin..end]);
        }
        kept.insert(key, entry);
    }
    let mut text = serde_json::to_vec(&kept).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&packed);
    std::fs::write(path, out).unwrap();
}

#[test]
fn run_streams_one_answer_to_the_terminal() {
    let dir = TempDir::new("cli-run");
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ncache_dir = \"{}\"\n[[plugins]]\nname = \"echo\"\npath = \"{}\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\n",
            dir.path().join("cache").display(),
            plugin_lib("echo").display()
        ),
    )
    .unwrap();
    let (ok, out, err) = switchyard(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--model",
        "bot",
        "--prompt",
        "hi from the cli",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "hi from the cli");
    assert!(err.contains("bot via echo@1.0.0"), "{err}");
}

/// The plugin copies left in the cache's `shadow/` (one directory per process that made some).
fn shadow_copies(cache: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(cache.join("shadow"))
        .map(|entries| entries.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

#[test]
fn serve_that_cannot_create_its_models_exits_1_and_leaves_no_plugin_copies() {
    let dir = TempDir::new("cli-failed-start");
    let cache = dir.path().join("cache");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\ncache_dir = \"{}\"\n[[plugins]]\nname = \"echo\"\npath = \"{}\"\n\
             [[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\nsettings = {{ fail_on_create = true }}\n",
            free_port(),
            cache.display(),
            plugin_lib("echo").display()
        ),
    )
    .unwrap();
    let (ok, _, err) = switchyard(&["serve", "--config", config.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(err.contains("fail_on_create is set"), "{err}");
    // There was no configuration before this one to keep serving.
    assert!(
        err.contains("the configuration could not be loaded"),
        "{err}"
    );
    assert!(!err.contains("keeps serving"), "{err}");
    // The library was copied into <cache>/shadow/<pid>/ to be loaded; a failed start removes
    // the copy as a clean exit does.
    let left = shadow_copies(&cache);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `switchyard run` leaves no plugin copies however it fails: a model it does not serve, a
/// request its model refuses, a media file that is not there (named, and refused before any
/// plugin is loaded).
#[test]
fn run_that_fails_leaves_no_plugin_copies() {
    let dir = TempDir::new("cli-failed-run");
    let cache = dir.path().join("cache");
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ncache_dir = \"{}\"\n[[plugins]]\nname = \"echo\"\npath = \"{}\"\n\
             [[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\n",
            cache.display(),
            plugin_lib("echo").display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let missing = dir.path().join("missing.png");
    for (args, needle) in [
        (vec!["--model", "nope", "--prompt", "x"], "nope"),
        (
            vec!["--model", "bot", "--prompt", "#panic"],
            "refused the request",
        ),
        (
            vec!["--model", "bot", "--image", missing.to_str().unwrap()],
            "missing.png",
        ),
    ] {
        let mut all = vec!["run", "--config", config];
        all.extend(&args);
        let (ok, _, err) = switchyard(&all);
        assert!(!ok, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        let left = shadow_copies(&cache);
        assert!(left.is_empty(), "{args:?} left behind: {left:?}");
    }
}

/// A start whose instance is still being created at `reload_timeout_secs` (a warm-up of a
/// minute here; a weights file on a hung mount in practice) exits with the timeout's error,
/// rather than waiting for the plugin's thread.
#[test]
fn serve_whose_model_outlasts_the_reload_timeout_exits_at_the_timeout() {
    let dir = TempDir::new("cli-slow-start");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\ncache_dir = \"{}\"\nreload_timeout_secs = 1\n\
             [[plugins]]\nname = \"echo\"\npath = \"{}\"\n\
             [[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\nsettings = {{ warm_delay_ms = 60000 }}\n",
            free_port(),
            dir.path().join("cache").display(),
            plugin_lib("echo").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(switchyard_bin())
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Well before the warm-up's minute is over.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("still running 30 s after a 1 s reload_timeout_secs");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("did not finish within reload_timeout_secs = 1"),
        "{err}"
    );
}

/// `GET path` on 127.0.0.1:`port`: the whole answer, head and body, if anything answers.
fn get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

fn get_status(port: u16, path: &str) -> Option<u16> {
    get(port, path)?.split_whitespace().nth(1)?.parse().ok()
}

/// A SIGHUP that arrives while the first load is still running (minutes, for a real
/// checkpoint) neither ends the process, as SIGHUP's default action would, nor is lost.
#[test]
fn a_sighup_during_the_first_load_neither_ends_the_process_nor_is_lost() {
    let dir = TempDir::new("cli-early-hup");
    let config = dir.path().join("serve.toml");
    let port = free_port();
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\ncache_dir = \"{}\"\n\
             [[plugins]]\nname = \"echo\"\npath = \"{}\"\n\
             [[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\nsettings = {{ warm_delay_ms = 2000 }}\n",
            dir.path().join("cache").display(),
            plugin_lib("echo").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(switchyard_bin())
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while get_status(port, "/ready") != Some(200) {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the process ended: {status:?}");
        }
        assert!(std::time::Instant::now() < deadline, "never ready");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The SIGHUP is served once serving starts: a second good load (the first is the start),
    // which reuses the one instance.
    let reloaded = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the process ended: {status:?}");
        }
        let text = get(port, "/metrics").unwrap_or_default();
        if text.contains("switchyard_reloads_total{result=\"ok\"} 2") {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    child.kill().unwrap();
    let _ = child.wait();
    assert!(reloaded, "the early SIGHUP was not served");
}

/// Paths relative to a config given by a bare file name start from the working directory, as
/// `serve` reads them: the plugin `echo.so` beside it is that file, not a library of the same
/// name on the library search path.
#[test]
fn bare_relative_names_mean_the_working_directory() {
    let dir = TempDir::new("cli-bare");
    std::fs::copy(plugin_lib("echo"), dir.path().join("echo.so")).unwrap();
    std::fs::write(
        dir.path().join("bare.toml"),
        "[[plugins]]\nname = \"echo\"\npath = \"echo.so\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\n",
    )
    .unwrap();
    let out = Command::new(switchyard_bin())
        .args(["config", "check", "bare.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("for 1 of 1)"), "{stdout}");
    let out = Command::new(switchyard_bin())
        .args(["plugins", "inspect", "echo.so"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["check"]["compatible"], true, "{v}");
}
