//! The three reload triggers besides `POST /admin/reload`: SIGHUP, a watched config file; and the
//! admin API on the main listener behind a bearer token.

use serde_json::json;
use std::time::Duration;
use switchyard_integration_tests::{plugin_lib, user, Server};

fn config(label: &str, server: &str) -> String {
    format!(
        "[server]\n{server}\n[[plugins]]\nname = \"echo\"\npath = \"{}\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\nsettings = {{ label = \"{label}\", tag_tokens = true }}\n",
        plugin_lib("echo").display()
    )
}

async fn label_served(server: &Server) -> String {
    let reply = server
        .chat(json!({"model": "bot", "messages": user("x")}))
        .await;
    reply
        .content()
        .split('/')
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap_or_default()
        .to_string()
}

async fn wait_for_label(server: &Server, label: &str) {
    for _ in 0..200 {
        if label_served(server).await == label {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("label {label} never served; log:\n{}", server.log());
}

#[tokio::test]
async fn sighup_reloads_the_config_file() {
    let server = Server::start(&config("first", "")).await;
    assert_eq!(label_served(&server).await, "first");
    server.rewrite_config(&config("second", ""));
    server.hang_up();
    wait_for_label(&server, "second").await;
    assert!(server.log().contains("SIGHUP: reloading the configuration"));
}

#[tokio::test]
async fn a_watched_config_file_reloads_once_when_it_changes() {
    let server = Server::start(&config("first", "watch_config = true")).await;
    let before = server.status().await["generation"].as_u64().unwrap();
    server.rewrite_config(&config("watched", "watch_config = true"));
    wait_for_label(&server, "watched").await;
    // The reload reads the file; that read is not a change. Five debounce periods later there
    // has been exactly one reload.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = server.log();
    assert_eq!(
        log.matches("config file changed: reloading").count(),
        1,
        "{log}"
    );
    assert_eq!(
        server.status().await["generation"].as_u64().unwrap(),
        before + 1
    );
}

/// The config path is a link to a file in another directory (a dotfiles checkout, a shared
/// mount): an edit of that file in place, which changes nothing beside the link, reloads.
#[tokio::test]
async fn a_watched_config_behind_a_link_to_another_directory_reloads_when_its_target_changes() {
    use std::os::unix::fs::symlink;
    let dir = switchyard_integration_tests::TempDir::new("linked-config");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("real.toml"), "").unwrap();
    symlink("elsewhere/real.toml", dir.path().join("switchyard.toml")).unwrap();
    // `start_in` writes the config through the link, into `elsewhere/real.toml`.
    let server = Server::start_in(dir, &config("first", "watch_config = true")).await;
    assert_eq!(label_served(&server).await, "first");
    std::fs::write(
        elsewhere.join("real.toml"),
        config("edited", "watch_config = true"),
    )
    .unwrap();
    wait_for_label(&server, "edited").await;
    assert!(server.log().contains("config file changed: reloading"));
}

#[tokio::test]
async fn a_config_file_that_does_not_validate_fails_its_reload_in_the_log_and_the_metrics() {
    let server = Server::start(&config("first", "")).await;
    server.rewrite_config(&config("second", "bogus_key = 1"));
    server.hang_up();
    let mut logged = false;
    for _ in 0..100 {
        logged = server.log().contains("reload failed");
        if logged {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = server.log();
    assert!(logged, "{log}");
    assert!(log.contains("bogus_key"), "the log names the key: {log}");
    assert!(
        server
            .metrics()
            .await
            .contains(r#"switchyard_reloads_total{result="failed"} 1"#),
        "{}",
        server.metrics().await
    );
    assert_eq!(label_served(&server).await, "first");
}

#[tokio::test]
async fn admin_on_the_main_listener_needs_the_bearer_token() {
    let token = "s3cret-token-0123456789";
    let server = Server::start(&config("t", &format!("admin_token = \"{token}\""))).await;
    let url = format!("{}/admin/status", server.base);
    assert_eq!(server.http.get(&url).send().await.unwrap().status(), 401);
    let wrong = server
        .http
        .get(&url)
        .bearer_auth("s3cret-token-0123456780")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let body: serde_json::Value = wrong.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let ok = server
        .http
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let reload = server
        .http
        .post(format!("{}/admin/reload", server.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 200);
}

/// A reload applies what it can and says which changed `[server]` keys wait for a restart.
#[tokio::test]
async fn a_reload_names_the_changed_keys_that_wait_for_a_restart() {
    let server = Server::start(&config("first", "")).await;
    server.rewrite_config(&config(
        "second",
        "max_connections = 7\nrequest_timeout_secs = 9",
    ));
    let (status, report) = server.reload().await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(label_served(&server).await, "second");
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("take effect only at start"))
        .unwrap_or_else(|| panic!("no restart warning in\n{log}"));
    // request_timeout_secs applies on reload: not named.
    assert!(
        line.contains("max_connections") && !line.contains("request_timeout"),
        "{line}"
    );
}
