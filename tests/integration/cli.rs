//! The `switchyard` command line: `plugins inspect`, `config check`, `run`.

use std::process::Command;
use switchyard_integration_tests::{plugin_lib, switchyard_bin, TempDir};

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
