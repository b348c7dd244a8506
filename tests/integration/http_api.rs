//! The OpenAI-compatible API of a real `switchyard serve` process, over loopback, with the real
//! echo and mirror plugins.

use base64::Engine as _;
use serde_json::json;
use switchyard_integration_tests::{plugin_lib, sse_data, user, Server};

fn config() -> String {
    format!(
        r#"
[server]
max_body_bytes = 65536
[[plugins]]
name = "echo"
path = "{echo}"
[[plugins]]
name = "mirror"
path = "{mirror}"
[[models]]
name = "echo-a"
plugin = "echo"
kind = "echo"
max_in_flight = 4
settings = {{ token_delay_ms = 20, slots = 4 }}
[[models]]
name = "mirror-a"
plugin = "mirror"
kind = "mirror"
[[routes]]
models = ["chat"]
modalities = ["text"]
backends = [{{ model = "echo-a" }}]
[[routes]]
models = ["chat"]
backends = [{{ model = "mirror-a" }}]
[[routes]]
models = ["org/chat"]
backends = [{{ model = "echo-a" }}]
"#,
        echo = plugin_lib("echo").display(),
        mirror = plugin_lib("mirror").display()
    )
}

#[tokio::test]
async fn chat_non_streaming_and_streaming() {
    let server = Server::start(&config()).await;

    let reply = server
        .chat(json!({"model": "chat", "messages": user("hello there world")}))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.content(), "hello there world");
    assert_eq!(reply.body["object"], "chat.completion");
    assert_eq!(reply.body["choices"][0]["finish_reason"], "stop");
    assert_eq!(reply.body["usage"]["completion_tokens"], 3);
    assert_eq!(reply.body["usage"]["total_tokens"], 6);
    assert_eq!(reply.instance, "echo-a");
    assert_eq!(reply.plugin, "echo@1.0.0");

    let stream = server
        .chat_stream(
            json!({"model": "chat", "messages": user("one two three four"), "stream": true,
                            "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(stream.status, 200);
    assert!(stream.done, "no [DONE]: {}", stream.raw);
    assert_eq!(stream.text(), "one two three four");
    assert_eq!(stream.finish_reason().as_deref(), Some("stop"));
    assert_eq!(stream.chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(stream
        .chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let usage = stream.chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert!(stream.chunks[1]["usage"].is_null());

    // max_tokens → finish_reason length; stop strings end early.
    let reply = server
        .chat(json!({"model": "chat", "messages": user("a b c d e"), "max_tokens": 2}))
        .await;
    assert_eq!(reply.content(), "a b");
    assert_eq!(reply.body["choices"][0]["finish_reason"], "length");
    let reply = server
        .chat(json!({"model": "chat", "messages": user("a b STOP d e"), "stop": ["STOP"]}))
        .await;
    assert_eq!(reply.content(), "a b");
}

/// `logprobs` / `top_logprobs` in OpenAI's shape, streamed and not, with vLLM's
/// `return_tokens_as_token_ids`; `model_options` reach the plugin verbatim (echo refuses every
/// key, naming it).
#[tokio::test]
async fn logprobs_and_model_options_pass_through_the_host() {
    let server = Server::start(&config()).await;
    let body =
        json!({"model": "chat", "messages": user("to be"), "logprobs": true, "top_logprobs": 2});
    let reply = server.chat(body.clone()).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let content = reply.body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs.content: {}", reply.body))
        .clone();
    // Echo's distribution is a point mass: each word has logprob 0 and is its only alternative.
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["token"], "to");
    assert_eq!(content[1]["token"], " be");
    assert_eq!(content[1]["bytes"], json!([32, 98, 101]));
    assert_eq!(content[1]["logprob"], 0.0);
    assert_eq!(
        content[1]["top_logprobs"],
        json!([{"token": " be", "logprob": 0.0, "bytes": [32, 98, 101]}])
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["return_tokens_as_token_ids"] = json!(true);
    let stream = server.chat_stream(streamed).await;
    assert!(stream.done, "{}", stream.raw);
    let entries: Vec<_> = stream
        .chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .map(|e| e["token"].clone())
        .collect();
    assert_eq!(entries, vec![json!("token_id:0"), json!("token_id:1")]);

    // Without `logprobs`, none are sent.
    let reply = server
        .chat(json!({"model": "chat", "messages": user("to be")}))
        .await;
    assert!(
        reply.body["choices"][0]["logprobs"].is_null(),
        "{}",
        reply.body
    );

    for (bad, param) in [
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"model_options": ["adapter"]}), "model_options"),
    ] {
        let mut body = json!({"model": "chat", "messages": user("x")});
        body.as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let reply = server.chat(body).await;
        assert_eq!(reply.status, 400, "{:?}", reply.body);
        assert_eq!(reply.body["error"]["param"], param, "{:?}", reply.body);
    }
    let reply = server
        .chat(json!({"model": "chat", "messages": user("x"), "model_options": {"temperature_boost": 2}}))
        .await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("model_options.temperature_boost"),
        "{message}"
    );
}

#[tokio::test]
async fn media_requests_route_by_modality_and_transcriptions_work() {
    let server = Server::start(&config()).await;
    let png = base64::engine::general_purpose::STANDARD.encode([1u8; 10]);
    let wav = base64::engine::general_purpose::STANDARD.encode([2u8; 7]);
    let reply = server
        .chat(
            json!({"model": "chat", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "describe"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}},
            {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]}]}),
        )
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.instance, "mirror-a");
    assert_eq!(reply.content(), "describe [image:10B] [audio:wav:7B]");

    let (status, body) = server
        .transcribe("mirror-a", "clip.wav", vec![0u8; 44], &[])
        .await;
    assert_eq!(status, 200);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["text"], "transcript: [audio:wav:44B]");

    let (_, text) = server
        .transcribe("mirror-a", "a.mp3", vec![0u8; 5], &[("stream", "true")])
        .await;
    assert!(text.contains("transcript.text.delta"), "{text}");
    // A flag that is neither true nor false is refused, not read as false.
    for flag in ["True", "1", ""] {
        let (status, body) = server
            .transcribe("mirror-a", "a.mp3", vec![0u8; 5], &[("stream", flag)])
            .await;
        assert_eq!(status, 400, "{flag:?}: {body}");
        assert!(body.contains(r#""param":"stream""#), "{flag:?}: {body}");
    }
    assert!(
        text.contains(r#""text":"transcript: [audio:mp3:5B]""#),
        "{text}"
    );
    // The done event's usage has the same shape as the answer's (OpenAI's for transcriptions).
    let done = sse_data(&text)
        .into_iter()
        .find(|v| v["type"] == "transcript.text.done")
        .unwrap_or_else(|| panic!("no done event: {text}"));
    assert_eq!(done["usage"]["type"], "tokens", "{done}");
    for key in ["input_tokens", "output_tokens", "total_tokens"] {
        assert!(done["usage"][key].is_u64(), "{key}: {done}");
        assert!(body["usage"][key].is_u64(), "{key}: {body}");
    }

    // The echo model serves no transcriptions: a clear 400.
    let (status, _) = server
        .transcribe("echo-a", "a.wav", vec![0u8; 5], &[])
        .await;
    assert_eq!(status, 400);

    // A temperature outside OpenAI's 0–1 for transcriptions is refused by name.
    for temperature in ["1e30", "-0.5", "NaN"] {
        let (status, body) = server
            .transcribe(
                "mirror-a",
                "clip.wav",
                vec![0u8; 44],
                &[("temperature", temperature)],
            )
            .await;
        assert_eq!(status, 400, "{temperature}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["param"], "temperature", "{body}");
    }

    // Two clips in one form: refused by name, not one of them silently dropped.
    let (status, body) = server
        .transcribe(
            "mirror-a",
            "b.wav",
            vec![0u8; 44],
            &[("file", "first clip")],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["param"], "file", "{body}");
    // Any field the endpoint reads, given twice.
    let (status, body) = server
        .transcribe("mirror-a", "b.wav", vec![0u8; 44], &[("model", "echo-a")])
        .await;
    assert_eq!(status, 400, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["param"], "model", "{body}");
}

#[tokio::test]
async fn bad_input_gets_openai_errors_and_the_server_keeps_serving() {
    let server = Server::start(&config()).await;
    let post = |body: String| {
        server
            .http
            .post(format!("{}/v1/chat/completions", server.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let r = post("{not json".into()).await.unwrap();
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("invalid JSON"));
    assert_eq!(
        body["error"]["param"],
        serde_json::Value::Null,
        "a syntax error has no field"
    );

    // A value of the wrong shape is named by its field.
    let r = post(
        json!({"model": "chat", "messages": [{"role": "user", "content": [{"type": "video"}]}]})
            .to_string(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        body["error"]["param"], "messages[0].content[0].type",
        "{body}"
    );

    let big = json!({"model": "chat", "messages": user(&"x ".repeat(40_000))}).to_string();
    let r = post(big).await.unwrap();
    assert_eq!(r.status(), 413);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["error"]["message"].is_string());

    let reply = server
        .chat(json!({"model": "nope", "messages": user("x")}))
        .await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.body["error"]["code"], "model_not_found");

    // Malformed media: empty image (the plugin refuses), bad base64 (the host refuses).
    let reply = server
        .chat(
            json!({"model": "chat", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}]}]}),
        )
        .await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert!(reply.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("empty image"));
    let reply = server
        .chat(
            json!({"model": "chat", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]}),
        )
        .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.body["error"]["param"], "messages[0].content[0]");

    // A panic inside the plugin's submit and inside its worker thread.
    let reply = server
        .chat(json!({"model": "chat", "messages": user("please #panic now")}))
        .await;
    assert_eq!(reply.status, 500);
    assert_eq!(reply.body["error"]["code"], "plugin_panic");
    // The instance refused by itself: the answer and the error series name it (the empty
    // image above went to mirror-a, the route's image instance).
    assert_eq!(reply.instance, "echo-a");
    let metrics = server.metrics().await;
    for series in [
        r#"switchyard_request_errors_total{instance="echo-a",plugin_version="1.0.0",kind="plugin_panic"} 1"#,
        r#"switchyard_request_errors_total{instance="mirror-a",plugin_version="0.3.0",kind="invalid_request"} 1"#,
        r#"switchyard_request_errors_total{instance="",plugin_version="",kind="invalid_request"} 3"#,
    ] {
        // A whole line: `} 1` must not match `} 10`.
        assert!(
            metrics.contains(&format!("{series}\n")),
            "{series} in\n{metrics}"
        );
    }
    let reply = server
        .chat(json!({"model": "chat", "messages": user("a #panic-worker b c")}))
        .await;
    assert_eq!(reply.status, 500);
    assert!(reply.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("worker"));
    let stream = server
        .chat_stream(json!({"model": "chat", "messages": user("x #fail y"), "stream": true}))
        .await;
    assert!(!stream.done, "a failed stream must not end with [DONE]");
    assert!(stream
        .chunks
        .iter()
        .any(|c| c["error"]["message"].is_string()));

    // Still serving.
    let reply = server
        .chat(json!({"model": "chat", "messages": user("still here")}))
        .await;
    assert_eq!(reply.content(), "still here");
    assert_eq!(server.status().await["instances"][0]["in_flight"], 0);
    // Each failure inside the plugin is in the log, naming its instance; the refusals of bad
    // input are not.
    let log = server.log();
    let faults: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("a request failed in its plugin"))
        .collect();
    for (what, code) in [
        ("plugin panicked in submit", "plugin_panic"),
        ("worker", "plugin_panic"),
        ("the request asked to fail", "internal_error"),
    ] {
        assert!(
            faults.iter().any(|l| l.contains(what)
                && l.contains("instance=echo-a")
                && l.contains(&format!("code=\"{code}\""))),
            "no fault line for {what:?} ({code}) in:\n{log}"
        );
    }
    assert_eq!(faults.len(), 3, "{faults:#?}");
}

#[tokio::test]
async fn health_ready_models_and_metrics() {
    let server = Server::start(&config()).await;
    let get = |path: &str| server.http.get(format!("{}{path}", server.base)).send();
    assert_eq!(get("/health").await.unwrap().text().await.unwrap(), "ok");
    let ready: serde_json::Value = get("/ready").await.unwrap().json().await.unwrap();
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["instances"]["echo-a"]["state"], "ready");
    let models: serde_json::Value = get("/v1/models").await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["chat", "org/chat", "echo-a", "mirror-a"]);
    // One model, as the SDKs' `models.retrieve` asks; `created` is when the configuration was
    // loaded, the same on every call.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let one: serde_json::Value = get("/v1/models/chat").await.unwrap().json().await.unwrap();
    assert_eq!(one, models["data"][0], "{one}");
    // A name with a slash, as Hugging Face names go, unescaped as clients send it.
    let slashed: serde_json::Value = get("/v1/models/org/chat")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(slashed, models["data"][1], "{slashed}");
    let garbled = get("/v1/models/%FF%FE").await.unwrap();
    assert_eq!(garbled.status(), 400);
    let garbled: serde_json::Value = garbled.json().await.unwrap();
    assert_eq!(garbled["error"]["code"], "invalid_model", "{garbled}");
    let missing = get("/v1/models/nope").await.unwrap();
    assert_eq!(missing.status(), 404);
    let missing: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(missing["error"]["code"], "model_not_found", "{missing}");

    server
        .chat(json!({"model": "chat", "messages": user("m e t r i c s")}))
        .await;
    let metrics = server.metrics().await;
    for needle in [
        "switchyard_requests_total{instance=\"echo-a\",plugin_version=\"1.0.0\",model=\"chat\",endpoint=\"chat\",status=\"200\"} 1",
        "switchyard_time_to_first_token_seconds_count{instance=\"echo-a\",plugin_version=\"1.0.0\"} 1",
        "switchyard_request_duration_seconds_bucket",
        "switchyard_in_flight{instance=\"echo-a\",plugin=\"echo\",plugin_version=\"1.0.0\"} 0",
        "switchyard_queue_depth",
        "switchyard_retired_libraries 0",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from:\n{metrics}");
    }
    // Admin endpoints are not on the public listener without a token.
    assert_eq!(get("/admin/status").await.unwrap().status(), 404);
    // A known path with another method: 405 in the API's error shape, with the Allow header.
    let r = get("/v1/chat/completions").await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    // An unknown path gets the API's error shape, naming the path.
    let r = get("/v1/chat/completion").await.unwrap();
    assert_eq!(r.status(), 404);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(r#"GET "/v1/chat/completion""#),
        "{body}"
    );
}

/// OpenAI fields that would change what a chat answer must be (structured output, tool calls)
/// are refused by name rather than answered as plain text; their neutral values, and null for
/// the flags, are accepted, as clients send them by default.
#[tokio::test]
async fn chat_refuses_what_it_cannot_honour_by_name() {
    let server = Server::start(&config()).await;
    let with = |extra: serde_json::Value| {
        let mut body = json!({"model": "echo-a", "messages": user("hello")});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    for (extra, param) in [
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
            "tools",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"functions": [{"name": "f"}]}), "functions"),
        (json!({"max_completion_tokens": 0}), "max_completion_tokens"),
        // A cap names the field the client sent.
        (
            json!({"max_completion_tokens": 100000}),
            "max_completion_tokens",
        ),
        (json!({"max_tokens": 100000}), "max_tokens"),
    ] {
        let reply = server.chat(with(extra.clone())).await;
        assert_eq!(reply.status, 400, "{extra}: {:?}", reply.body);
        assert_eq!(
            reply.body["error"]["param"], param,
            "{extra}: {:?}",
            reply.body
        );
    }
    // A malformed message names the part and what is wrong with it; an assistant turn may have
    // no content, a user's may not.
    let message = |content: serde_json::Value| json!({"model": "echo-a", "messages": [{"role": "user", "content": content}]});
    for (body, param, needle) in [
        (
            message(json!([{"type": "video_url", "video_url": {"url": "x"}}])),
            "messages[0].content[0].type",
            "unknown variant `video_url`, expected one of `text`, `image_url`, `input_audio`",
        ),
        (
            message(json!([{"type": "text"}])),
            "messages[0].content[0].text",
            "missing field `text`",
        ),
        (
            message(json!(5)),
            "messages[0].content",
            "expected a string or a list of content parts",
        ),
        (
            message(json!(null)),
            "messages[0].content",
            "content is required",
        ),
    ] {
        let reply = server.chat(body.clone()).await;
        assert_eq!(reply.status, 400, "{body}: {:?}", reply.body);
        assert_eq!(
            reply.body["error"]["param"], param,
            "{body}: {:?}",
            reply.body
        );
        let text = reply.body["error"]["message"].as_str().unwrap();
        assert!(text.contains(needle), "{body}: {text}");
    }
    let reply = server
        .chat(json!({"model": "echo-a", "messages": [
            {"role": "assistant", "content": null}, {"role": "user", "content": "yo"}]}))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);

    let neutral = json!({"response_format": {"type": "text"}, "tools": [], "tool_choice": "auto",
                         "stream": null, "return_tokens_as_token_ids": null, "logit_bias": null,
                         "presence_penalty": null});
    let reply = server.chat(with(neutral)).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.content(), "hello");

    // Answer ids differ across processes (a restart, another replica), not only within one.
    let other = Server::start(&config()).await;
    let first = |reply: &switchyard_integration_tests::ChatReply| {
        reply.body["id"].as_str().unwrap().to_string()
    };
    let a = first(&server.chat(with(json!({}))).await);
    let b = first(&other.chat(with(json!({}))).await);
    assert!(
        a.starts_with("chatcmpl-") && b.starts_with("chatcmpl-"),
        "{a} {b}"
    );
    assert_ne!(a[..25], b[..25], "{a} {b}");
}
