//! Graceful termination for rollouts: on SIGTERM `/ready` goes false at once, new requests get
//! 503, the requests in flight finish, and the process exits 0 within `drain_timeout_secs`.

use futures_util::StreamExt;
use serde_json::json;
use std::time::{Duration, Instant};
use switchyard_integration_tests::{plugin_lib, user, Server};

const STREAMS: usize = 16;
const WORDS: usize = 20;
const TOKEN_DELAY_MS: u64 = 100;
const DRAIN_TIMEOUT_SECS: u64 = 15;

#[tokio::test]
async fn sigterm_finishes_the_streams_in_flight_refuses_new_ones_and_exits_0() {
    let config = format!(
        r#"
[server]
drain_timeout_secs = {DRAIN_TIMEOUT_SECS}
[[plugins]]
name = "echo"
path = "{echo}"
[[models]]
name = "echo-a"
plugin = "echo"
kind = "echo"
max_in_flight = 64
settings = {{ token_delay_ms = {TOKEN_DELAY_MS}, slots = {STREAMS} }}
"#,
        echo = plugin_lib("echo").display()
    );
    let mut server = Server::start(&config).await;
    let prompt: Vec<String> = (0..WORDS).map(|i| format!("w{i}")).collect();
    let body = json!({"model": "echo-a", "messages": user(&prompt.join(" ")), "stream": true});
    let mut streams = Vec::new();
    let mut first_bytes = Vec::new();
    for _ in 0..STREAMS {
        let request = server
            .http
            .post(format!("{}/v1/chat/completions", server.base))
            .json(&body);
        let (tx, rx) = tokio::sync::oneshot::channel();
        first_bytes.push(rx);
        streams.push(tokio::spawn(async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let mut bytes = response.bytes_stream();
            let mut raw = String::new();
            let mut tx = Some(tx);
            while let Some(chunk) = bytes.next().await {
                match chunk {
                    Ok(chunk) => raw.push_str(&String::from_utf8_lossy(&chunk)),
                    Err(e) => {
                        raw.push_str(&format!("\n<transport error: {e}>"));
                        break;
                    }
                }
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
            (status, raw)
        }));
    }
    // Every stream is in flight (its first chunk arrived) before the signal.
    for rx in first_bytes {
        rx.await.expect("a stream ended before its first chunk");
    }
    let signalled = Instant::now();
    server.terminate();

    // Readiness goes false at once, while the streams still run.
    let ready = loop {
        let r = server
            .http
            .get(format!("{}/ready", server.base))
            .send()
            .await
            .unwrap();
        if r.status() == 503 || signalled.elapsed() > Duration::from_secs(1) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        ready.status(),
        503,
        "/ready still 200 a second after SIGTERM"
    );
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(ready["ready"], false);
    assert_eq!(ready["terminating"], true);
    // A reload asked for during the drain is refused, and said so in the log (checked below).
    server.hang_up();
    // New requests are refused with 503, on both generation endpoints.
    let reply = server
        .chat(json!({"model": "echo-a", "messages": user("too late")}))
        .await;
    assert_eq!(reply.status, 503, "{:?}", reply.body);
    // Retry-After, as every 503 carries: the client tries again, at another replica.
    assert!(
        !reply.retry_after.is_empty(),
        "no Retry-After: {:?}",
        reply.body
    );
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{:?}",
        reply.body
    );
    let (status, _) = server
        .post_json(
            "/v1/completions",
            &json!({"model": "echo-a", "prompt": "too late"}),
        )
        .await;
    assert_eq!(status, 503);
    let still_running = signalled.elapsed();
    let stream_secs = (WORDS as u64 * TOKEN_DELAY_MS) as f64 / 1000.0;
    assert!(
        still_running.as_secs_f64() < stream_secs,
        "the checks took {still_running:?}, longer than a stream ({stream_secs} s)"
    );

    // Every stream in flight completes: all its words, its finish and [DONE].
    for stream in streams {
        let (status, raw) = stream.await.unwrap();
        assert_eq!(status, 200);
        assert!(raw.contains("data: [DONE]"), "{raw}");
        assert!(raw.contains(r#""finish_reason":"stop""#), "{raw}");
        for word in &prompt {
            assert!(raw.contains(&format!("{word}\"")), "{word} missing: {raw}");
        }
    }
    // And the process exits 0 within the drain timeout.
    let status = server
        .wait_exit(Duration::from_secs(DRAIN_TIMEOUT_SECS))
        .await
        .unwrap_or_else(|| panic!("still running {DRAIN_TIMEOUT_SECS} s after SIGTERM"));
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(DRAIN_TIMEOUT_SECS));
    let log = server.log();
    assert!(
        log.contains("reload refused: the server is shutting down (SIGTERM)"),
        "{log}"
    );
}

/// A reload that timed out leaves its plugin thread behind (here a warm-up of a minute; a
/// weights file on a hung mount in practice). SIGTERM still ends the process at once with 0:
/// the exit does not wait for that thread.
#[tokio::test]
async fn sigterm_exits_without_waiting_for_a_creation_a_reload_left_behind() {
    let config = |settings: &str, timeout: &str| {
        format!(
            "[server]\ndrain_timeout_secs = 2\n{timeout}\n[[plugins]]\nname = \"echo\"\npath = \"{}\"\n\
             [[models]]\nname = \"echo-a\"\nplugin = \"echo\"\nkind = \"echo\"\nsettings = {{ {settings} }}\n",
            plugin_lib("echo").display()
        )
    };
    let mut server = Server::start(&config("", "")).await;
    server.rewrite_config(&config("warm_delay_ms = 60000", "reload_timeout_secs = 1"));
    let (code, body) = server.reload().await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("reload_timeout_secs"),
        "{body}"
    );
    let signalled = Instant::now();
    server.terminate();
    let status = server
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exited well before the left-behind warm-up's minute");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(30));
}

/// Ctrl-C twice at a terminal: the first starts the drain, as SIGTERM does; the second, while a
/// stream still runs for many seconds more, ends the process at once with 130 and leaves no
/// plugin copies behind.
#[tokio::test]
async fn a_second_sigint_exits_at_once_with_130() {
    let config = format!(
        "[server]\ndrain_timeout_secs = 60\n[[plugins]]\nname = \"echo\"\npath = \"{}\"\n\
         [[models]]\nname = \"echo-a\"\nplugin = \"echo\"\nkind = \"echo\"\n\
         settings = {{ token_delay_ms = 1000 }}\n",
        plugin_lib("echo").display()
    );
    let mut server = Server::start(&config).await;
    // 30 words at a second each: the drain would wait for it.
    let words: Vec<String> = (0..30).map(|i| format!("w{i}")).collect();
    let response = server
        .http
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&json!({"model": "echo-a", "messages": user(&words.join(" ")), "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    stream
        .next()
        .await
        .expect("the stream's first bytes")
        .unwrap();
    server.interrupt();
    // Draining: the first SIGINT is the graceful one.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = server.http.get(format!("{}/ready", server.base)).send();
        if ready.await.unwrap().status() == 503 {
            break;
        }
        assert!(Instant::now() < until, "/ready still 200 after SIGINT");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        server.wait_exit(Duration::from_secs(1)).await.is_none(),
        "the first SIGINT did not wait for the stream"
    );
    // This process's plugin copy, which the forced exit must remove.
    let copies = server
        .dir
        .path()
        .join(format!("cache/switchyard/shadow/{}", server.pid()));
    assert!(copies.is_dir(), "no plugin copies at {copies:?}");
    server.interrupt();
    let status = server
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("still running 10 s after a second SIGINT");
    assert_eq!(status.code(), Some(130), "{status:?}");
    let log = server.log();
    assert!(log.contains("a second SIGINT"), "{log}");
    assert!(!copies.exists(), "plugin copies left behind at {copies:?}");
}
