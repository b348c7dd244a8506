//! The `switchyard` command line: `plugins inspect`, `config check`, `run`.

use std::process::Command;
use switchyard_integration_tests::{free_port, plugin_lib, switchyard_bin, TempDir};

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
    assert!(out.contains("ok (1 plugins, 1 models, 0 routes)"), "{out}");

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
    let left: Vec<_> = std::fs::read_dir(cache.join("shadow"))
        .map(|entries| entries.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
}
