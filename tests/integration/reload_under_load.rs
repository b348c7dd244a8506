//! The reload bar: while 32 streaming clients run for 30 s, reload to another plugin version at
//! least 10 times (the plugin file overwritten in place between reloads). Zero failed or truncated
//! responses; each response served entirely by one version; old instances reach the stopped state;
//! the retired-library count is reported.

use serde_json::json;
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use switchyard_integration_tests::{plugin_lib, user, Server, TempDir};

const CLIENTS: usize = 32;
const RUN_FOR: Duration = Duration::from_secs(30);
const RELOADS: usize = 12;
const WORDS: usize = 16;

fn config(dir: &std::path::Path) -> String {
    format!(
        r#"
[server]
drain_timeout_secs = 30
[[plugins]]
name = "echo"
path = "{}/echo.so"
[[models]]
name = "bot"
plugin = "echo"
kind = "echo"
max_in_flight = 256
settings = {{ token_delay_ms = 4, slots = 64, queue = 64, tag_tokens = true }}
"#,
        dir.display()
    )
}

#[derive(Default, Debug)]
struct Tally {
    ok: usize,
    by_version: std::collections::BTreeMap<String, usize>,
    failures: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reload_under_streaming_load_fails_nothing() {
    let dir = TempDir::new("reload-load");
    let versions = [plugin_lib("echo"), plugin_lib("echo_v2")];
    let live = dir.path().join("echo.so");
    std::fs::copy(&versions[0], &live).unwrap();
    let server = Arc::new(Server::start_in(dir, &config(live.parent().unwrap())).await);

    let stop = Arc::new(AtomicBool::new(false));
    let words: Vec<String> = (0..WORDS).map(|i| format!("w{i}")).collect();
    let prompt = words.join(" ");
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (server, stop, prompt, words) =
            (server.clone(), stop.clone(), prompt.clone(), words.clone());
        clients.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            while !stop.load(Ordering::Relaxed) {
                let reply = server
                    .chat_stream(json!({"model": "bot", "messages": user(&prompt), "stream": true}))
                    .await;
                match check(&reply, &words) {
                    Ok(version) => {
                        tally.ok += 1;
                        *tally.by_version.entry(version).or_default() += 1;
                    }
                    Err(e) => tally.failures.push(e),
                }
            }
            tally
        }));
    }

    let started = Instant::now();
    let gap = RUN_FOR / (RELOADS as u32 + 1);
    for i in 0..RELOADS {
        tokio::time::sleep(gap).await;
        // Overwrite the library in place, as a careless deploy would (not a rename).
        std::fs::copy(&versions[(i + 1) % 2], &live).unwrap();
        let (code, body) = server.reload().await;
        assert_eq!(code, 200, "reload {i}: {body}");
        let expected = if i % 2 == 0 {
            "echo@2.0.0"
        } else {
            "echo@1.0.0"
        };
        assert_eq!(body["report"]["plugins"][0], expected, "reload {i}: {body}");
    }
    tokio::time::sleep(RUN_FOR.saturating_sub(started.elapsed())).await;
    stop.store(true, Ordering::Relaxed);

    let mut total = Tally::default();
    for client in clients {
        let t = client.await.unwrap();
        total.ok += t.ok;
        total.failures.extend(t.failures);
        for (v, n) in t.by_version {
            *total.by_version.entry(v).or_default() += n;
        }
    }
    assert!(
        total.failures.is_empty(),
        "{} failed responses, first: {:?}",
        total.failures.len(),
        &total.failures[..total.failures.len().min(3)]
    );
    assert!(total.ok > 500, "too few requests completed: {total:?}");
    assert_eq!(total.by_version.len(), 2, "both versions served: {total:?}");
    eprintln!(
        "reload soak: {} responses ok, by version {:?}",
        total.ok, total.by_version
    );

    // Every retired instance reaches `stopped`.
    let status = server
        .status_until("every retired instance stopped", |s| {
            s["retired_instances"]
                .as_array()
                .unwrap()
                .iter()
                .all(|i| i["state"] == "stopped")
        })
        .await;
    let retired = status["retired_instances"].as_array().unwrap();
    assert_eq!(retired.len(), RELOADS, "{status}");
    assert!(
        retired
            .iter()
            .all(|i| i["state"] == "stopped" && i["in_flight"] == 0),
        "{status}"
    );
    // Two libraries mapped (v1, v2), one in use: one retired, reported in status and metrics.
    assert_eq!(status["retired_libraries"], 1, "{status}");
    assert!(server
        .metrics()
        .await
        .contains("switchyard_retired_libraries 1"));
}

/// Ok(version) when the stream is complete and every token came from one plugin version.
fn check(
    reply: &switchyard_integration_tests::StreamReply,
    words: &[String],
) -> Result<String, String> {
    if reply.status != 200 {
        return Err(format!("status {}: {}", reply.status, reply.raw));
    }
    if !reply.done || reply.finish_reason().as_deref() != Some("stop") {
        return Err(format!("truncated: {}", reply.raw));
    }
    let text = reply.text();
    let tokens: Vec<&str> = text.split(' ').collect();
    if tokens.len() != words.len() {
        return Err(format!(
            "{} tokens, expected {}: {text}",
            tokens.len(),
            words.len()
        ));
    }
    let mut version = None;
    for (token, word) in tokens.iter().zip(words) {
        let Some((tag, rest)) = token.split_once(']') else {
            return Err(format!("untagged token {token}"));
        };
        if rest != word {
            return Err(format!("token {token} for word {word}"));
        }
        let tag = tag
            .trim_start_matches('[')
            .trim_end_matches('/')
            .to_string();
        match &version {
            None => version = Some(tag),
            Some(v) if *v != tag => {
                return Err(format!("mixed versions in one response: {v} and {tag}"))
            }
            _ => {}
        }
    }
    let version = version.unwrap_or_default();
    if version != reply.plugin {
        return Err(format!(
            "header says {} but tokens say {version}",
            reply.plugin
        ));
    }
    Ok(version)
}
