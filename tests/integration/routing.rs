//! Routing in one process with two plugins and two versions of the same plugin: by requested
//! model name, by modality, by header; weighted splits; fallbacks; admission limits; and a client
//! that disconnects mid-stream freeing its slot inside the plugin.

use serde_json::json;
use std::time::Duration;
use switchyard_integration_tests::{plugin_lib, user, Server};

fn config() -> String {
    format!(
        r#"
[server]
retry_after_secs = 2
[[plugins]]
name = "echo-v1"
path = "{v1}"
[[plugins]]
name = "echo-v2"
path = "{v2}"
[[plugins]]
name = "mirror"
path = "{mirror}"

[[models]]
name = "stable"
plugin = "echo-v1"
kind = "echo"
[[models]]
name = "canary"
plugin = "echo-v2"
kind = "echo"
[[models]]
name = "vision"
plugin = "mirror"
kind = "mirror"
[[models]]
name = "tiny"
plugin = "echo-v1"
kind = "echo"
max_in_flight = 1
settings = {{ token_delay_ms = 200 }}
[[models]]
name = "tiny-backup"
plugin = "echo-v2"
kind = "echo"
max_in_flight = 1
settings = {{ token_delay_ms = 200 }}
[[models]]
name = "slow"
plugin = "echo-v1"
kind = "echo"
settings = {{ token_delay_ms = 50, slots = 2, queue = 0 }}

# Header-pinned canary first: routes are tried in order.
[[routes]]
models = ["assistant"]
header = {{ name = "x-canary", value = "yes" }}
backends = [{{ model = "canary" }}]
[[routes]]
models = ["assistant"]
modalities = ["image", "audio", "image+audio"]
backends = [{{ model = "vision" }}]
[[routes]]
models = ["assistant", "gpt-4o-mini"]
modalities = ["text"]
backends = [{{ model = "stable", weight = 3 }}, {{ model = "canary", weight = 1 }}]
[[routes]]
models = ["limited"]
backends = [{{ model = "tiny" }}]
fallbacks = ["tiny-backup"]
[[routes]]
models = ["limited-alone"]
backends = [{{ model = "tiny" }}]
"#,
        v1 = plugin_lib("echo").display(),
        v2 = plugin_lib("echo_v2").display(),
        mirror = plugin_lib("mirror").display()
    )
}

#[tokio::test]
async fn routes_by_name_modality_header_and_weight() {
    let server = Server::start(&config()).await;
    let status = server.status().await;
    let versions: Vec<String> = status["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}@{}",
                p["name"].as_str().unwrap(),
                p["version"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        versions,
        ["echo@1.0.0", "echo@2.0.0", "mirror@0.3.0"],
        "two plugins, two versions of one"
    );

    // Weighted 3:1 split, deterministic over any window of 4.
    let mut served = Vec::new();
    for _ in 0..8 {
        let reply = server
            .chat(json!({"model": "assistant", "messages": user("hi")}))
            .await;
        assert_eq!(reply.status, 200);
        served.push(reply.plugin);
    }
    assert_eq!(
        served.iter().filter(|p| *p == "echo@1.0.0").count(),
        6,
        "{served:?}"
    );
    assert_eq!(
        served.iter().filter(|p| *p == "echo@2.0.0").count(),
        2,
        "{served:?}"
    );

    // An alias of the same route.
    let reply = server
        .chat(json!({"model": "gpt-4o-mini", "messages": user("hi")}))
        .await;
    assert!(reply.instance == "stable" || reply.instance == "canary");

    // Header pins the canary whatever the weights say.
    for _ in 0..4 {
        let reply = server
            .chat_with(
                json!({"model": "assistant", "messages": user("hi")}),
                &[("x-canary", "yes")],
            )
            .await;
        assert_eq!(reply.instance, "canary");
        assert_eq!(reply.plugin, "echo@2.0.0");
    }

    // Modality: an image goes to the mirror plugin.
    let reply = server
        .chat(
            json!({"model": "assistant", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
        )
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.instance, "vision");
    assert_eq!(reply.plugin, "mirror@0.3.0");

    // Instances are addressable by name too.
    let reply = server
        .chat(json!({"model": "canary", "messages": user("direct")}))
        .await;
    assert_eq!(reply.instance, "canary");

    // A medium the model cannot take, sent to it by name: 400, naming the part in `param`.
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
    let reply = server
        .chat(json!({"model": "stable", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]}]}))
        .await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    let error = &reply.body["error"];
    assert_eq!(error["code"], "unsupported", "{error}");
    assert_eq!(error["param"], "messages[1].content[1]", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("model stable does not serve image requests"),
        "{error}"
    );
}

#[tokio::test]
async fn fallback_when_full_then_429_with_retry_after() {
    let server = Server::start(&config()).await;
    let long = json!({"model": "limited-alone", "messages": user("one two three four five six"), "stream": true});
    // Occupy `tiny` (max_in_flight 1) with a slow stream.
    let busy = server.chat_in_background(long);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The route with a fallback goes to tiny-backup.
    let reply = server
        .chat(json!({"model": "limited", "messages": user("x")}))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.instance, "tiny-backup");

    // The route without one is refused with 429 and Retry-After.
    let reply = server
        .chat(json!({"model": "limited-alone", "messages": user("x")}))
        .await;
    assert_eq!(reply.status, 429, "{:?}", reply.body);
    assert_eq!(reply.retry_after, "2");
    assert_eq!(reply.body["error"]["type"], "rate_limit_error");
    assert!(reply.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_in_flight"));
    busy.await.unwrap();

    // The plugin's own queue bound also maps to 429: `slow` has 2 slots and no queue.
    let holders: Vec<_> = (0..2)
        .map(|_| {
            server.chat_in_background(
                json!({"model": "slow", "messages": user("a b c d e f g h"), "stream": true}),
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reply = server
        .chat(json!({"model": "slow", "messages": user("x")}))
        .await;
    assert_eq!(reply.status, 429, "{:?}", reply.body);
    for h in holders {
        h.await.unwrap();
    }
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_frees_the_slot() {
    let server = Server::start(&config()).await;
    let body = json!({"model": "slow", "messages": user(&"w ".repeat(200)), "stream": true});
    let stream = server.open_stream(body).await;
    let slow = |status: &serde_json::Value| {
        status["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "slow")
            .unwrap()
            .clone()
    };
    // The first chunk (the role) is the host's; the row may still be queued in the plugin for
    // a moment on a loaded machine.
    let during = slow(
        &server
            .status_until("the slow request running", |s| {
                slow(s)["stats"]["running"] == 1
            })
            .await,
    );
    assert_eq!(during["in_flight"], 1);
    drop(stream); // the client goes away after one chunk of a 200-token answer

    let after = slow(
        &server
            .status_until("the slot freed", |s| {
                let i = slow(s);
                i["stats"]["running"] == 0 && i["in_flight"] == 0
            })
            .await,
    );
    assert_eq!(after["stats"]["free_slots"], 2);
    assert_eq!(after["in_flight"], 0);
    let metrics = server.metrics().await;
    assert!(metrics.contains("kind=\"client_closed\"} 1"), "{metrics}");
}
