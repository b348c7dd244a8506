//! Reloads that must fail — an incompatible plugin, a missing file, a bad sha256 pin, a panic in
//! model creation or in the settings check, a failing warm-up, an invalid config, the
//! retired-library cap — each leave the running state untouched and say what went wrong.

use serde_json::json;
use switchyard_integration_tests::{plugin_lib, user, Server};

fn config(plugin: &str, extra_plugin: &str, settings: &str, server: &str) -> String {
    format!(
        r#"
[server]
{server}
[[plugins]]
name = "echo"
path = "{plugin}"
{extra_plugin}
[[models]]
name = "bot"
plugin = "echo"
kind = "echo"
settings = {{ {settings} }}
"#
    )
}

async fn assert_still_serving_v1(server: &Server, generation: &serde_json::Value) {
    let reply = server
        .chat(json!({"model": "bot", "messages": user("still v1")}))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.plugin, "echo@1.0.0");
    assert_eq!(reply.content(), "still v1");
    let status = server.status().await;
    assert_eq!(
        &status["generation"], generation,
        "the generation changed after a failed reload"
    );
    assert_eq!(status["instances"][0]["state"], "ready");
}

#[tokio::test]
async fn failed_reloads_keep_the_old_state_serving() {
    let v1 = plugin_lib("echo").display().to_string();
    let v2 = plugin_lib("echo_v2").display().to_string();
    let incompatible = plugin_lib("incompatible").display().to_string();
    let server = Server::start(&config(&v1, "", "", "")).await;
    let generation = server.status().await["generation"].clone();
    assert_still_serving_v1(&server, &generation).await;

    let v1_sha = server.status().await["plugins"][0]["sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let wrong_pin = "0".repeat(64);
    let cases: Vec<(&str, String, u16, Vec<&str>)> = vec![
        (
            "incompatible ABI",
            config(&incompatible, "", "", ""),
            422,
            vec!["incompatible ABI", "type layouts differ"],
        ),
        (
            "missing file",
            config("{dir}/does-not-exist.so", "", "", ""),
            400,
            vec!["plugins[0].path", "no such file"],
        ),
        (
            "bad sha256 pin",
            config(&v2, &format!("sha256 = \"{wrong_pin}\""), "", ""),
            422,
            vec!["sha256 pin mismatch", &wrong_pin],
        ),
        (
            "panic in model creation",
            config(&v2, "", "panic_on_create = true", ""),
            422,
            vec![
                "models[0] (bot): creation failed",
                "panicked in create_model",
                "panic_on_create is set",
            ],
        ),
        (
            "failed warm-up",
            config(&v2, "", "fail_on_warm = true", ""),
            422,
            vec!["warm-up failed"],
        ),
        (
            "invalid settings",
            config(&v2, "", "no_such_setting = 1", ""),
            422,
            vec![
                "models[0] (bot): settings refused by the plugin's check",
                "unknown field `no_such_setting`",
            ],
        ),
        (
            "panic in the settings check",
            config(&v2, "", "panic_on_check = true", ""),
            422,
            vec![
                "models[0] (bot): settings refused by the plugin's check",
                "panicked in check_settings",
                "panic_on_check is set",
            ],
        ),
        (
            "invalid config: unknown key",
            config(&v2, "", "", "lisen = 1"),
            400,
            vec!["lisen"],
        ),
        (
            "invalid config: bad TOML",
            "[[plugins]\nname=".to_string(),
            400,
            vec!["switchyard.toml"],
        ),
        (
            "retired-library cap",
            config(&v2, "", "", "retired_library_cap = 0"),
            422,
            vec!["retired plugin libraries", "cap of 0"],
        ),
    ];
    for (what, text, status, needles) in cases {
        server.rewrite_config(&text);
        let (code, body) = server.reload().await;
        assert_eq!(code, status, "{what}: {body}");
        assert_eq!(body["ok"], false, "{what}: {body}");
        let error = body["error"].as_str().unwrap();
        for needle in needles {
            assert!(
                error.contains(needle),
                "{what}: {needle:?} not in {error:?}"
            );
        }
        assert_still_serving_v1(&server, &generation).await;
    }
    // Only the good library and none of the refused ones stays loaded as in use.
    let status = server.status().await;
    let in_use: Vec<_> = status["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["in_use"] == true)
        .collect();
    assert_eq!(in_use.len(), 1);
    assert_eq!(in_use[0]["sha256"], v1_sha.as_str());
    let log = server.log();
    assert!(
        log.contains("reload failed; the previous configuration keeps serving"),
        "{log}"
    );

    // And a good reload after all that still works.
    server.rewrite_config(&config(&v2, "", "", ""));
    let (code, body) = server.reload().await;
    assert_eq!(code, 200, "{body}");
    let reply = server
        .chat(json!({"model": "bot", "messages": user("now v2")}))
        .await;
    assert_eq!(reply.plugin, "echo@2.0.0");
}

/// The plugins check every new model's settings before any model is created: a reload whose
/// second model is refused fails without creating (and warming, here for a minute) the first.
#[tokio::test]
async fn a_reload_checks_every_new_models_settings_before_creating_any() {
    let v1 = plugin_lib("echo").display().to_string();
    let v2 = plugin_lib("echo_v2").display().to_string();
    let server = Server::start(&config(&v1, "", "", "")).await;
    let generation = server.status().await["generation"].clone();
    // `bot` on the new plugin, a model whose warm-up takes a minute, then `last`.
    let slow_then = |last: &str| {
        format!(
            "{}\n[[models]]\nname = \"slow-to-warm\"\nplugin = \"echo\"\nkind = \"echo\"\n\
             settings = {{ warm_delay_ms = 60000 }}\n[[models]]\nplugin = \"echo\"\n{last}\n",
            config(&v2, "", "", "reload_timeout_secs = 120")
        )
    };
    server.rewrite_config(&slow_then(
        "name = \"refused\"\nkind = \"echo\"\nsettings = { slots = 0 }",
    ));
    let (code, body) = server.reload().await;
    assert_eq!(code, 422, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains(
            "models[2] (refused): settings refused by the plugin's check: slots must be at least 1"
        ),
        "{error}"
    );
    let log = server.log();
    assert!(
        !log.contains("slow-to-warm"),
        "no model was created before the refusal: {log}"
    );
    assert_still_serving_v1(&server, &generation).await;

    // A kind the plugin does not have is found in the same pass.
    server.rewrite_config(&slow_then("name = \"mistyped\"\nkind = \"ecko\""));
    let (code, body) = server.reload().await;
    assert_eq!(code, 422, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("models[2] (mistyped): plugin echo@2.0.0 has no model kind \"ecko\""),
        "{error}"
    );
    assert!(!server.log().contains("slow-to-warm"), "{}", server.log());
    assert_still_serving_v1(&server, &generation).await;
}

/// The settings checks read files (a checkpoint on a hung mount may never answer): together
/// they get `reload_timeout_secs`, and the reload fails at it instead of holding the reload
/// turn for ever; the next reload is not stuck behind it.
#[tokio::test]
async fn settings_checks_that_outlast_the_reload_timeout_fail_the_reload() {
    let v1 = plugin_lib("echo").display().to_string();
    let v2 = plugin_lib("echo_v2").display().to_string();
    let server = Server::start(&config(&v1, "", "", "")).await;
    let generation = server.status().await["generation"].clone();
    server.rewrite_config(&config(
        &v2,
        "",
        "check_delay_ms = 60000",
        "reload_timeout_secs = 1",
    ));
    let (code, body) = server.reload().await;
    assert_eq!(code, 422, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains(
            "models[0] (bot): the plugin's settings check did not finish within \
             reload_timeout_secs = 1"
        ),
        "{error}"
    );
    assert_still_serving_v1(&server, &generation).await;
    server.rewrite_config(&config(&v2, "", "", ""));
    let (code, body) = server.reload().await;
    assert_eq!(code, 200, "{body}");
}
