//! The serving surface under hostile clients (issue 15): safe metrics, HTTP limits, the admin
//! guard, content types, operator caps, heavy work off the runtime, reload and drain.

use serde_json::json;
use std::time::{Duration, Instant};
use switchyard_integration_tests::{plugin_lib, user, Server};

/// One echo instance `bot` behind the route `chat`, with `server` lines in `[server]` and
/// `model` lines in its `[[models]]` table.
fn config(server: &str, settings: &str, model: &str) -> String {
    format!(
        r#"
[server]
{server}
[[plugins]]
name = "echo"
path = "{echo}"
[[models]]
name = "bot"
plugin = "echo"
kind = "echo"
settings = {{ {settings} }}
{model}
[[routes]]
models = ["chat"]
backends = [{{ model = "bot" }}]
"#,
        echo = plugin_lib("echo").display()
    )
}

/// Parses `/metrics` with a real Prometheus text parser; panics when it cannot.
fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).unwrap_or_else(|e| panic!("{e}:\n{text}"))
}

#[tokio::test]
async fn hostile_model_names_leave_metrics_parseable_and_the_same_size() {
    let server = Server::start(&config("", "", "")).await;
    // One request under a known name and one under an unknown one, so both series exist.
    let reply = server
        .chat(json!({"model": "chat", "messages": user("hi")}))
        .await;
    assert_eq!(reply.status, 200);
    let reply = server
        .chat(json!({"model": "no-such-model", "messages": user("hi")}))
        .await;
    assert_eq!(reply.status, 404);
    let before = server.metrics().await;
    let scrape = parse_metrics(&before);
    let unknown = |scrape: &prometheus_parse::Scrape| {
        scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "switchyard_requests_total" && s.labels.get("model") == Some("unknown")
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                ref other => panic!("{other:?}"),
            })
    };
    assert_eq!(unknown(&scrape), Some(1.0), "{before}");

    let hostile = [
        "a\"} 1\nforged_total{x=\"1\"} 7\n".to_string(),
        "line\nbreak\\".to_string(),
        "x".repeat(100 * 1024),
    ];
    for name in &hostile {
        let reply = server
            .chat(json!({"model": name, "messages": user("hi")}))
            .await;
        assert_eq!(reply.status, 404, "{:?}", reply.body);
    }
    let after = server.metrics().await;
    let scrape = parse_metrics(&after);
    assert_eq!(unknown(&scrape), Some(4.0), "{after}");
    assert_eq!(after.len(), before.len(), "{after}");
    assert!(!after.contains("forged_total"), "{after}");
    for sample in &scrape.samples {
        if let Some(model) = sample.labels.get("model") {
            assert!(["chat", "unknown"].contains(&model), "{model:?} in {after}");
        }
    }
}
