//! The serving surface under hostile clients (issue 15): safe metrics, HTTP limits, the admin
//! guard, content types, operator caps, heavy work off the runtime, reload and drain.

use crate::phi4mm_hardening as phi4mm;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use switchyard_integration_tests::{plugin_lib, proc_status_kb, reset_peak_rss, user, Server};

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

/// An error repeats at most 64 characters of the client's own text, whatever field or header
/// it came in: a 100 KB role, `Origin` or `Host` (a 60 KB path) is not answered in kind.
#[tokio::test]
async fn client_text_in_errors_is_cut_short() {
    let server = Server::start(&config("", "", "")).await;
    let long = "x".repeat(100_000);
    let role = json!({"model": "chat", "messages": [{"role": long, "content": "hi"}]});
    let reply = server.chat(role).await;
    let get = |base: &str, path: &str| server.http.get(format!("{base}{path}"));
    // A path of 64 KiB or more is hyper's 414 (the URI's own limit).
    let path = get(&server.base, &format!("/{}", &long[..60_000]))
        .send()
        .await
        .unwrap();
    let origin = get(&server.admin, "/admin/status").header("origin", format!("http://{long}"));
    let origin = origin.send().await.unwrap();
    let host = get(&server.admin, "/admin/status")
        .header("host", &long)
        .send()
        .await
        .unwrap();
    let mut answers = vec![(reply.status, reply.body.to_string())];
    for response in [path, origin, host] {
        answers.push((response.status().as_u16(), response.text().await.unwrap()));
    }
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [400, 404, 403, 403]);
    for (_, body) in &answers {
        assert!(body.len() < 1000, "{} bytes: {}", body.len(), &body[..300]);
        let message = serde_json::from_str::<Value>(body).unwrap()["error"]["message"].clone();
        let message = message.as_str().unwrap();
        // Quoted, 64 characters, then the length: "xxx"… (100000 bytes).
        assert!(
            message.contains("\"… (") && message.contains(" bytes)"),
            "{message}"
        );
        assert!(message.len() < 300, "{message}");
    }
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

/// Writes `bytes` one at a time, `every` apart, until the server closes the connection or
/// `give_up` passes; returns how long after the start the connection was closed.
async fn trickle(
    addr: &str,
    bytes: Vec<u8>,
    every: Duration,
    give_up: Duration,
) -> Option<Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let writer = tokio::spawn(async move {
        for b in bytes.iter().cycle() {
            if write.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
    });
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(give_up, async {
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {} // a 408 before the close
            }
        }
    })
    .await
    .ok();
    writer.abort();
    closed
}

/// The slowest of `n` `/health` requests made while something else goes on.
async fn slowest_health(server: &Server, n: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..n {
        let t = Instant::now();
        let r = server
            .http
            .get(format!("{}/health", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        slowest = slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    slowest
}

#[tokio::test]
async fn slowloris_and_trickled_bodies_are_closed_within_the_timeouts() {
    let server = Server::start(&config(
        "header_read_timeout_secs = 1\nbody_read_timeout_secs = 1",
        "",
        "",
    ))
    .await;
    let addr = server.base.trim_start_matches("http://").to_string();
    let give_up = Duration::from_secs(10);
    let head =
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaa".to_vec();
    let mut slow = Vec::new();
    for _ in 0..64 {
        let (addr, head) = (addr.clone(), head.clone());
        slow.push(tokio::spawn(async move {
            trickle(&addr, head, Duration::from_millis(100), give_up).await
        }));
    }
    let body_head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n";
    let mut trickled = body_head.to_vec();
    trickled.extend(std::iter::repeat_n(b' ', 1000));
    let body = {
        let addr = addr.clone();
        tokio::spawn(async move {
            // The head goes at once (the body timer starts after it), then a byte per 50 ms.
            use tokio::io::AsyncWriteExt;
            let started = Instant::now();
            let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            stream.write_all(body_head).await.unwrap();
            let (mut read, mut write) = stream.into_split();
            let writer = tokio::spawn(async move {
                loop {
                    if write.write_all(b" ").await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            use tokio::io::AsyncReadExt;
            let mut answer = Vec::new();
            let read = tokio::time::timeout(give_up, read.read_to_end(&mut answer)).await;
            writer.abort();
            (
                read.is_ok(),
                started.elapsed(),
                String::from_utf8_lossy(&answer).to_string(),
            )
        })
    };
    // Meanwhile the server answers others at once.
    let slowest = slowest_health(&server, 40).await;
    assert!(
        slowest < Duration::from_millis(500),
        "/health took {slowest:?}"
    );
    for task in slow {
        let closed = task
            .await
            .unwrap()
            .expect("a slowloris connection stayed open 10 s");
        assert!(closed < Duration::from_secs(4), "closed after {closed:?}");
    }
    let (closed, after, answer) = body.await.unwrap();
    assert!(closed, "the trickled body stayed open 10 s");
    assert!(after < Duration::from_secs(4), "closed after {after:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_read_timeout_secs = 1"), "{answer}");

    // A kept-alive connection idle after its response is closed after the header-read timeout.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let idle_since = Instant::now();
        let eof = tokio::time::timeout(give_up, async {
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(
            eof.is_ok(),
            "an idle kept-alive connection stayed open 10 s"
        );
        let idle = idle_since.elapsed();
        assert!(idle < Duration::from_secs(4), "closed after {idle:?}");
    }
    let reply = server
        .chat(json!({"model": "chat", "messages": user("still here")}))
        .await;
    assert_eq!(reply.content(), "still here");
}

#[tokio::test]
async fn connections_beyond_max_connections_wait() {
    let server = Server::start(&config(
        "max_connections = 4\nheader_read_timeout_secs = 60",
        "",
        "",
    ))
    .await;
    let addr = server.base.trim_start_matches("http://").to_string();
    // Server::start's client keeps a connection alive; a fresh client for every probe.
    let probe = || async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(1500))
            .build()
            .unwrap();
        client.get(format!("{}/health", server.base)).send().await
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // The idle pooled connection of `server.http` may hold one of the four: drop it by
    // closing the held ones only after the check.
    assert!(probe().await.is_err(), "a fifth connection was served");
    drop(held);
    let r = probe().await.expect("served once the others closed");
    assert_eq!(r.status(), 200);
}

/// A client that stops reading a long stream: its writes wait on a full socket, and after
/// `write_timeout_secs` the server closes the connection, ending the request and freeing the
/// model's one `max_in_flight` place, though the client still holds its socket open.
#[tokio::test]
async fn a_client_that_stops_reading_is_cut_after_write_timeout_secs() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(&config("write_timeout_secs = 2", "", "max_in_flight = 1")).await;
    // About 8 MB of chunks (4096 words of 200 bytes, each with its log probability's bytes),
    // more than the socket buffers hold (tcp_wmem's 4 MiB at most, and a 4 KiB receive buffer).
    let word = "w".repeat(200);
    let prompt = vec![word.as_str(); 4096].join(" ");
    let body =
        json!({"model": "chat", "messages": user(&prompt), "stream": true, "logprobs": true})
            .to_string();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr = server.base.trim_start_matches("http://").parse().unwrap();
    let mut held = socket.connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    held.write_all(head.as_bytes()).await.unwrap();
    held.write_all(body.as_bytes()).await.unwrap();
    // The answer has begun (its head and first chunks); from here on nothing is read.
    let mut first = [0u8; 1024];
    let n = held.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let stalled = Instant::now();

    let short = || server.chat(json!({"model": "chat", "messages": user("hi")}));
    let reply = short().await;
    assert_eq!(
        reply.status, 429,
        "the stalled stream does not hold its place: {:?}",
        reply.body
    );
    loop {
        let reply = short().await;
        if reply.status == 200 {
            break;
        }
        assert_eq!(reply.status, 429, "{:?}", reply.body);
        assert!(
            stalled.elapsed() < Duration::from_secs(30),
            "the stalled stream still holds max_in_flight after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Not before the write had waited (the timeout is 2 s; the stream may have filled the
    // buffers a little after its first bytes).
    assert!(
        stalled.elapsed() >= Duration::from_secs(1),
        "{:?}",
        stalled.elapsed()
    );
    drop(held);
}

#[tokio::test]
async fn admin_refuses_cross_site_and_foreign_host_and_endpoints_check_content_types() {
    let server = Server::start(&config("", "", "")).await;
    let reload = format!("{}/admin/reload", server.admin);
    let status = format!("{}/admin/status", server.admin);
    let send = |r: reqwest::RequestBuilder| async move {
        let r = r.send().await.unwrap();
        let code = r.status().as_u16();
        (
            code,
            r.json::<serde_json::Value>().await.unwrap_or_default(),
        )
    };
    let json_post = || {
        server
            .http
            .post(&reload)
            .header("content-type", "application/json")
    };

    let (code, body) = send(json_post().header("origin", "http://evil.example")).await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["error"]["code"], "cross_site_request");
    let (code, _) = send(json_post().header("sec-fetch-site", "cross-site")).await;
    assert_eq!(code, 403);
    // A form-like POST: no JSON content type, no admin header.
    let (code, body) = send(
        server
            .http
            .post(&reload)
            .header("content-type", "text/plain"),
    )
    .await;
    assert_eq!(code, 415, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("x-switchyard-admin"));
    // DNS rebinding: a foreign Host on a loopback connection.
    let (code, body) = send(server.http.get(&status).header("host", "evil.example:8081")).await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["error"]["code"], "foreign_host");
    // What stays allowed: loopback Host, same-origin, JSON or the admin header.
    let generation = server.status().await["generation"].as_u64().unwrap();
    let (code, body) = send(json_post().header("origin", "http://127.0.0.1:3000")).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = send(server.http.post(&reload).header("x-switchyard-admin", "1")).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(server.status().await["generation"], generation + 2);

    // Chat takes JSON only; transcription multipart only.
    let chat = format!("{}/v1/chat/completions", server.base);
    let body = json!({"model": "chat", "messages": user("hi")}).to_string();
    let (code, reply) = send(
        server
            .http
            .post(&chat)
            .header("content-type", "text/plain")
            .body(body.clone()),
    )
    .await;
    assert_eq!(code, 415, "{reply}");
    assert_eq!(reply["error"]["code"], "unsupported_media_type");
    let (code, _) = send(server.http.post(&chat).body(body)).await;
    assert_eq!(code, 415);
    let transcription = format!("{}/v1/audio/transcriptions", server.base);
    let (code, reply) = send(
        server
            .http
            .post(&transcription)
            .json(&json!({"model": "chat"})),
    )
    .await;
    assert_eq!(code, 415, "{reply}");
    let reply = server
        .chat(json!({"model": "chat", "messages": user("fine")}))
        .await;
    assert_eq!(reply.content(), "fine");
}

#[tokio::test]
async fn each_operator_cap_answers_400_naming_its_limit() {
    let limits =
        "limits = { max_tokens_limit = 8, default_max_tokens = 3, max_prompt_bytes = 100, \
                  max_stop_sequences = 2, max_stop_bytes = 5, max_content_parts = 3 }";
    let server = Server::start(&config("", "", limits)).await;
    // Each refusal names its cap, and its `param` the request field at fault.
    let refused = |body: serde_json::Value, limit: &'static str, param: &'static str| {
        let server = &server;
        async move {
            let reply = server.chat(body).await;
            assert_eq!(reply.status, 400, "{limit}: {:?}", reply.body);
            let message = reply.body["error"]["message"].as_str().unwrap().to_string();
            assert!(message.contains(limit), "{limit} not named in {message}");
            assert_eq!(reply.body["error"]["param"], param, "{limit}");
            message
        }
    };
    let message = refused(
        json!({"model": "chat", "messages": user("hi"), "max_tokens": 100000}),
        "max_tokens_limit = 8",
        "max_tokens",
    )
    .await;
    assert!(message.contains("max_tokens 100000"), "{message}");
    refused(
        json!({"model": "chat", "messages": user(&"x".repeat(101))}),
        "max_prompt_bytes = 100",
        "messages",
    )
    .await;
    refused(
        json!({"model": "chat", "messages": user("hi"), "stop": ["a", "b", "c"]}),
        "max_stop_sequences = 2",
        "stop",
    )
    .await;
    refused(
        json!({"model": "chat", "messages": user("hi"), "stop": "toolong"}),
        "max_stop_bytes = 5",
        "stop",
    )
    .await;
    let parts: Vec<_> = (0..4)
        .map(|_| json!({"type": "text", "text": "a"}))
        .collect();
    refused(
        json!({"model": "chat", "messages": [{"role": "user", "content": parts}]}),
        "max_content_parts = 3",
        "messages",
    )
    .await;
    // Messages without content count as a part each: they cannot pass the cap in any number.
    let empty: Vec<_> = (0..4)
        .map(|_| json!({"role": "user", "content": []}))
        .collect();
    refused(
        json!({"model": "chat", "messages": empty}),
        "max_content_parts = 3",
        "messages",
    )
    .await;
    // Within the caps: served; without max_tokens the default (3) applies.
    let reply = server
        .chat(json!({"model": "chat", "messages": user("one two three four five"), "stop": ["zz"], "max_tokens": 8}))
        .await;
    assert_eq!(reply.content(), "one two three four five");
    let reply = server
        .chat(json!({"model": "chat", "messages": user("one two three four five")}))
        .await;
    assert_eq!(reply.content(), "one two three");
    assert_eq!(reply.body["choices"][0]["finish_reason"], "length");
}

/// serde builds a node of 32 bytes or more per JSON value, and `[]` is three bytes of text: a
/// 3 MB body of empty arrays under `model_options` cost over 100 MB to parse. Such a body is
/// refused before its parse, naming the limit.
#[tokio::test]
async fn a_body_of_a_million_empty_arrays_is_refused_before_its_parse() {
    let server = Server::start(&config("", "", "")).await;
    let body = format!(
        r#"{{"model":"chat","messages":[{{"role":"user","content":"hi"}}],"model_options":{{"a":[{}[]]}}}}"#,
        "[],".repeat(1 << 20)
    );
    // Warm: the first request's allocations are not the parse's.
    assert_eq!(
        server
            .chat(json!({"model": "chat", "messages": user("hi")}))
            .await
            .status,
        200
    );
    let pid = server.pid();
    reset_peak_rss(pid);
    let before = proc_status_kb(pid, "VmRSS:");
    let reply = server
        .http
        .post(format!("{}/v1/chat/completions", server.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 400);
    let reply: Value = reply.json().await.unwrap();
    assert_eq!(reply["error"]["code"], "too_many_json_values", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1048576 values"),
        "{reply}"
    );
    let peak = proc_status_kb(pid, "VmHWM:");
    assert!(
        peak < before + 32 * 1024,
        "the refused 3 MB body raised the peak RSS from {before} kB to {peak} kB"
    );
    assert_eq!(
        server
            .chat(json!({"model": "chat", "messages": user("hi")}))
            .await
            .status,
        200
    );
}

/// Bodies being read count against one budget: clients that each send most of a large body
/// and hold it cannot together hold more than `max_buffered_body_bytes`. Past it, a large body
/// is refused at once (503, naming the key, with `Retry-After`); small requests are still
/// served; and the budget comes back when the holders go.
#[tokio::test]
async fn bodies_held_at_once_stay_within_max_buffered_body_bytes() {
    use tokio::io::AsyncWriteExt;
    let server = Server::start(&config(
        "max_body_bytes = 1048576\nmax_buffered_body_bytes = 2097152",
        "",
        "",
    ))
    .await;
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\
                    content-type: application/json\r\ncontent-length: 1048576\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        // All but the last KiB, then nothing: the body is held, unfinished.
        stream
            .write_all(&vec![b' '; (1 << 20) - 1024])
            .await
            .unwrap();
        holders.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let large = json!({"model": "chat", "messages": user(&"x ".repeat(100_000))});
    let reply = server.chat(large.clone()).await;
    let brief = |body: &Value| body.to_string().chars().take(300).collect::<String>();
    assert_eq!(reply.status, 503, "{}", brief(&reply.body));
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("max_buffered_body_bytes = 2097152"),
        "{message}"
    );
    let small = server
        .chat(json!({"model": "chat", "messages": user("hi")}))
        .await;
    assert_eq!(small.status, 200);
    drop(holders);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reply = server.chat(large).await;
    assert_eq!(reply.status, 200, "{}", brief(&reply.body));
}

#[tokio::test]
async fn large_media_requests_do_not_stall_health() {
    use base64::Engine as _;
    // The mirror flavour of the echo plugin takes media.
    let config = config("max_body_bytes = 16777216", "", "")
        .replace(
            &plugin_lib("echo").display().to_string(),
            &plugin_lib("mirror").display().to_string(),
        )
        .replace("kind = \"echo\"", "kind = \"mirror\"");
    let server = Server::start(&config).await;
    let image = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 4 << 20]);
    let body = json!({"model": "chat", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{image}")}}]}]});
    let mut heavy = Vec::new();
    for _ in 0..6 {
        heavy.push(server.chat_in_background(body.clone()));
    }
    let slowest = slowest_health(&server, 30).await;
    for task in heavy {
        let text = task.await.unwrap();
        assert!(
            text.contains("[image:4194304B]"),
            "{}",
            &text[..text.len().min(300)]
        );
    }
    assert!(
        slowest < Duration::from_millis(200),
        "/health took {slowest:?}"
    );
}

#[tokio::test]
async fn a_reload_whose_warm_up_hangs_times_out_and_the_old_deployment_serves() {
    let server = Server::start(&config("reload_timeout_secs = 1", "", "")).await;
    let generation = server.status().await["generation"].clone();
    server.rewrite_config(&config(
        "reload_timeout_secs = 1",
        "warm_delay_ms = 8000",
        "",
    ));
    let t = Instant::now();
    let (code, body) = server.reload().await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(code, 422, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("reload_timeout_secs = 1"), "{error}");
    assert_eq!(server.status().await["generation"], generation);
    let reply = server
        .chat(json!({"model": "chat", "messages": user("old one")}))
        .await;
    assert_eq!(reply.content(), "old one");
}

#[tokio::test]
async fn requests_cut_at_the_drain_deadline_or_past_their_timeout_get_errors() {
    let slow = "token_delay_ms = 200";
    let server_lines = "drain_timeout_secs = 0.5";
    let server = Server::start(&config(server_lines, slow, "")).await;
    let words = "w ".repeat(40);
    let body = json!({"model": "chat", "messages": user(&words)});
    let plain = server.chat_in_background(body.clone());
    let streamed = {
        let mut body = body.clone();
        body["stream"] = json!(true);
        let server_http = server.http.clone();
        let url = format!("{}/v1/chat/completions", server.base);
        tokio::spawn(async move {
            server_http
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A changed setting makes a new instance; the old one drains for 0.5 s, then is cut.
    server.rewrite_config(&config(server_lines, "token_delay_ms = 201", ""));
    let (code, body) = server.reload().await;
    assert_eq!(code, 200, "{body}");
    let plain = plain.await.unwrap();
    let plain: serde_json::Value = serde_json::from_str(&plain).unwrap();
    assert_eq!(plain["error"]["code"], "cancelled", "{plain}");
    assert!(
        plain["error"]["message"]
            .as_str()
            .unwrap()
            .contains("drain_timeout_secs"),
        "{plain}"
    );
    let streamed = streamed.await.unwrap();
    assert!(streamed.contains("\"code\":\"cancelled\""), "{streamed}");
    assert!(!streamed.contains("[DONE]"), "{streamed}");

    // The wall-clock limit of one request.
    let server = Server::start(&config("request_timeout_secs = 1", slow, "")).await;
    let t = Instant::now();
    let reply = server
        .chat(json!({"model": "chat", "messages": user(&words)}))
        .await;
    assert_eq!(reply.status, 504, "{:?}", reply.body);
    assert_eq!(reply.body["error"]["code"], "request_timeout");
    assert!(reply.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("request_timeout_secs = 1"));
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
}

/// The whole hostile mix against one server, with a mirror instance (which takes media and
/// transcriptions) and a Phi4MM instance: forged model names, bad JSON, oversized and trickled
/// bodies, wrong content types, cross-site and foreign-Host admin calls, requests over every
/// cap, large media, and Phi4MM's media and metadata bombs, forged tokens and max-size prompts
/// ([`crate::phi4mm_hardening::hostile_round`]). Afterwards it still answers chat and
/// transcription on both instances and reloads, and its resident memory is within 1.5× of where
/// it started.
#[tokio::test]
async fn after_the_hostile_mix_the_server_serves_and_its_memory_is_back() {
    use base64::Engine as _;
    use tokio::io::AsyncWriteExt;
    let config = config(
        "max_body_bytes = 8388608\nheader_read_timeout_secs = 1\nbody_read_timeout_secs = 1",
        "",
        "limits = { max_tokens_limit = 64, max_stop_sequences = 4 }",
    )
    .replace(
        &plugin_lib("echo").display().to_string(),
        &plugin_lib("mirror").display().to_string(),
    )
    .replace("kind = \"echo\"", "kind = \"mirror\"")
        + &phi4mm::phi4mm_tables(", limits = { max_audio_samples_per_clip = 1000000 }", "");
    let server = Server::start(&config).await;
    let normal = json!({"model": "chat", "messages": user("one two three"), "max_tokens": 8});
    let wav = phi4mm::input("audio_16k.wav");
    let phi4mm_chat = phi4mm::chat(json!([
        phi4mm::text_part("What is this?"),
        phi4mm::audio_part(&wav, "wav")
    ]));
    // Chat and transcription on both instances.
    async fn serves_both(server: &Server, normal: &Value, phi4mm_chat: &Value, wav: &[u8]) {
        assert_eq!(server.chat(normal.clone()).await.content(), "one two three");
        let (status, body) = server.transcribe("chat", "a.wav", vec![0u8; 44], &[]).await;
        assert_eq!(status, 200, "{body}");
        let reply = server.chat(phi4mm_chat.clone()).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        assert_eq!(
            reply.body["usage"]["completion_tokens"], 2,
            "{:?}",
            reply.body
        );
        let (status, body) = server
            .transcribe("phi4mm-tiny", "a.wav", wav.to_vec(), &[])
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // Warm every path once, so that one-time allocations (pools, tables) count as the start.
    // Phi4MM's hostile round is among them: its first 1 MiB prompts start the blocking-pool
    // threads (stacks, glibc arenas) and fill the tokenizer's bounded word cache, once, about
    // 25 MB measured against a 22 MB start; what the test asserts is that repeating the hostile
    // mix adds nothing more.
    serves_both(&server, &normal, &phi4mm_chat, &wav).await;
    phi4mm::hostile_round(&server).await;
    server.metrics().await;
    let start = proc_status_kb(server.pid(), "VmRSS:");

    let post = |body: Vec<u8>, content_type: &'static str| {
        server
            .http
            .post(format!("{}/v1/chat/completions", server.base))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let image = base64::engine::general_purpose::STANDARD.encode(vec![7u8; 3 << 20]);
    for round in 0..3 {
        for name in ["a\"b", "x\ny", &"m".repeat(100_000)] {
            let reply = server
                .chat(json!({"model": name, "messages": user("x")}))
                .await;
            assert_eq!(reply.status, 404, "round {round}");
        }
        for body in [&b"{not json"[..], b"[]", b"{\"model\": 1}", b"\xff\xfe"] {
            let status = post(body.to_vec(), "application/json")
                .await
                .unwrap()
                .status();
            assert_eq!(status, 400, "round {round}: {body:?}");
        }
        // Over max_body_bytes: answered 413, or cut off while the client still writes.
        let oversized = vec![b' '; 9 << 20];
        match post(oversized, "application/json").await {
            Ok(reply) => assert_eq!(reply.status(), 413, "round {round}"),
            Err(e) => assert!(e.is_request(), "round {round}: {e}"),
        }
        let status = post(normal.to_string().into_bytes(), "text/plain")
            .await
            .unwrap()
            .status();
        assert_eq!(status, 415, "round {round}");
        let reply = server
            .chat(json!({"model": "chat", "messages": user("x"), "max_tokens": 100000}))
            .await;
        assert_eq!(reply.status, 400, "round {round}");
        let stops: Vec<String> = (0..5000).map(|i| format!("{i:0>200}")).collect();
        let reply = server
            .chat(json!({"model": "chat", "messages": user("x"), "stop": stops}))
            .await;
        assert_eq!(reply.status, 400, "round {round}");
        let cross_site = server
            .http
            .post(format!("{}/admin/reload", server.admin))
            .header("origin", "https://evil.example")
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(cross_site, 403, "round {round}");
        let foreign = server
            .http
            .get(format!("{}/admin/status", server.admin))
            .header("host", "evil.example")
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(foreign, 403, "round {round}");
        // Half-open connections that never finish their headers.
        let addr = server.base.trim_start_matches("http://").to_string();
        let mut half_open = Vec::new();
        for _ in 0..16 {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            half_open.push(s);
        }
        let media = json!({"model": "chat", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{image}")}}]}]});
        let reply = server.chat(media).await;
        assert_eq!(reply.status, 200, "round {round}: {:?}", reply.body);
        phi4mm::hostile_round(&server).await;
        drop(half_open);
    }
    // Let the header-read timeout close what the hostile clients left behind.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    serves_both(&server, &normal, &phi4mm_chat, &wav).await;
    let (status, report) = server.reload().await;
    assert_eq!(status, 200, "{report}");
    let metrics = server.metrics().await;
    parse_metrics(&metrics);
    // Memory goes back through the host's once-a-second `malloc_trim` and the blocking pool's
    // idle threads exiting (tokio keeps them 10 s): under a loaded CI machine more of those
    // threads start, so the figure is read until it settles, for at most 15 s.
    let settled_by = Instant::now() + Duration::from_secs(15);
    let mut end = proc_status_kb(server.pid(), "VmRSS:");
    while end * 2 > start * 3 && Instant::now() < settled_by {
        tokio::time::sleep(Duration::from_millis(250)).await;
        end = proc_status_kb(server.pid(), "VmRSS:");
    }
    eprintln!("resident memory: {start} kB after the warm-up, {end} kB at the end");
    assert!(
        end * 2 <= start * 3,
        "resident memory grew from {start} kB to {end} kB (more than 1.5×)"
    );
}
