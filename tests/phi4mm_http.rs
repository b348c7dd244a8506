//! Phi4MM end to end through a real `switchyard serve`: the real plugin library, the tiny fixture
//! checkpoint, real HTTP over loopback. Random weights make the words gibberish, so these tests
//! check the plumbing (every modality, both endpoints, streaming, disconnect), not the text;
//! numerical exactness is checked against the fixture in `plugin-phi4mm/tests/`.

use base64::Engine as _;
use serde_json::json;
use std::time::Duration;
use switchyard_integration_tests::{target_profile_dir, workspace_root, Server};

fn config() -> String {
    format!(
        r#"
[[plugins]]
name = "phi4mm"
path = "{lib}"
[[models]]
name = "phi4mm-tiny"
plugin = "phi4mm"
kind = "phi4mm"
settings = {{ checkpoint = "{ckpt}", slots = 2, default_max_tokens = 8 }}
"#,
        lib = target_profile_dir()
            .join("libswitchyard_phi4mm.so")
            .display(),
        ckpt = workspace_root()
            .join("tests/fixtures/phi4mm-tiny/model")
            .display()
    )
}

fn input(name: &str) -> String {
    let bytes = std::fs::read(
        workspace_root()
            .join("tests/fixtures/phi4mm-tiny/inputs")
            .join(name),
    )
    .unwrap();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn every_modality_and_both_endpoints_over_http() {
    let server = Server::start(&config()).await;
    let image = json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", input("img_small.png"))}});
    let audio = json!({"type": "input_audio", "input_audio": {"data": input("audio_16k.wav"), "format": "wav"}});
    let text = json!({"type": "text", "text": "What is this?"});
    for (what, content, min_prompt) in [
        ("text", json!("Hello"), 2),
        ("image", json!([text, image]), 256),
        ("audio", json!([text, audio]), 10),
        ("image+audio", json!([text, image, audio]), 266),
    ] {
        let body = json!({"model": "phi4mm-tiny", "max_tokens": 4, "temperature": 0,
                          "messages": [{"role": "user", "content": content}]});
        let reply = server.chat(body.clone()).await;
        assert_eq!(reply.status, 200, "{what}: {:?}", reply.body);
        assert_eq!(
            reply.body["usage"]["completion_tokens"], 4,
            "{what}: {:?}",
            reply.body
        );
        assert!(
            reply.body["usage"]["prompt_tokens"].as_u64().unwrap() >= min_prompt,
            "{what}: {:?}",
            reply.body
        );
        let mut streamed = body;
        streamed["stream"] = json!(true);
        let stream = server.chat_stream(streamed).await;
        assert!(stream.done, "{what}: {}", stream.raw);
        // Greedy: the streamed answer equals the non-streamed one.
        assert_eq!(stream.text(), reply.content(), "{what}");
    }

    let wav =
        std::fs::read(workspace_root().join("tests/fixtures/phi4mm-tiny/inputs/audio_16k.wav"))
            .unwrap();
    let form = reqwest::multipart::Form::new()
        .text("model", "phi4mm-tiny")
        .part(
            "file",
            reqwest::multipart::Part::bytes(wav.clone()).file_name("clip.wav"),
        );
    let r = server
        .http
        .post(format!("{}/v1/audio/transcriptions", server.base))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["text"].is_string(), "{body}");
    let form = reqwest::multipart::Form::new()
        .text("model", "phi4mm-tiny")
        .text("stream", "true")
        .part(
            "file",
            reqwest::multipart::Part::bytes(wav).file_name("clip.wav"),
        );
    let r = server
        .http
        .post(format!("{}/v1/audio/transcriptions", server.base))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    assert!(text.contains("transcript.text.done"), "{text}");

    // Malformed media: a clear 400, and the instance keeps serving.
    let bad = json!({"model": "phi4mm-tiny", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]});
    let reply = server.chat(bad).await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    let reply = server.chat(json!({"model": "phi4mm-tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "ok"}]})).await;
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_frees_its_slot() {
    use futures_util::StreamExt;
    let server = Server::start(&config()).await;
    let body = json!({"model": "phi4mm-tiny", "stream": true, "max_tokens": 2000, "temperature": 0,
                      "messages": [{"role": "user", "content": "Tell me a long story."}]});
    let response = server
        .http
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let _first = stream.next().await.unwrap().unwrap();
    // The host sends the role chunk at once; wait until the request holds a slot in the plugin.
    let mut during = serde_json::Value::Null;
    for _ in 0..200 {
        during = server.status().await["instances"][0].clone();
        if during["stats"]["running"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(during["in_flight"], 1, "{during}");
    assert_eq!(during["stats"]["running"], 1, "{during}");
    assert_eq!(during["stats"]["free_slots"], 1, "{during}");
    drop(stream);
    let mut stats = serde_json::Value::Null;
    for _ in 0..200 {
        stats = server.status().await["instances"][0].clone();
        if stats["in_flight"] == 0
            && stats["stats"]["running"] == 0
            && stats["stats"]["free_slots"] == 2
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("slot not freed after the client left: {stats}");
}

/// The IREE backend behind the same HTTP API: every modality answers exactly as the host backend
/// does (greedy, same tokens), and `/admin/status` shows the backend and its artifact cache.
#[cfg(feature = "iree")]
#[tokio::test]
async fn the_iree_backend_answers_like_the_host_backend() {
    // The artifact cache the plugin's own IREE tests fill, and the same decoder shape, so the
    // modules are compiled once per test run.
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("iree-cache");
    let config = format!(
        r#"
[[plugins]]
name = "phi4mm"
path = "{lib}"
[[models]]
name = "host"
plugin = "phi4mm"
kind = "phi4mm"
settings = {{ checkpoint = "{ckpt}", slots = 2, default_max_tokens = 6 }}
[[models]]
name = "iree"
plugin = "phi4mm"
kind = "phi4mm"
settings = {{ checkpoint = "{ckpt}", slots = 2, default_max_tokens = 6, backend = "iree", iree = {{ cache_dir = "{cache}", context = 4160 }} }}
"#,
        lib = target_profile_dir()
            .join("libswitchyard_phi4mm.so")
            .display(),
        ckpt = workspace_root()
            .join("tests/fixtures/phi4mm-tiny/model")
            .display(),
        cache = cache.display(),
    );
    let server = Server::start(&config).await;
    let image = json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", input("img_small.png"))}});
    let audio = json!({"type": "input_audio", "input_audio": {"data": input("audio_16k.wav"), "format": "wav"}});
    let text = json!({"type": "text", "text": "What is this?"});
    for (what, content) in [
        ("text", json!("Hello")),
        ("image", json!([text, image])),
        ("audio", json!([text, audio])),
        ("image+audio", json!([text, image, audio])),
    ] {
        let mut replies = Vec::new();
        for model in ["host", "iree"] {
            let body = json!({"model": model, "max_tokens": 6, "temperature": 0,
                              "messages": [{"role": "user", "content": content}]});
            let reply = server.chat(body).await;
            assert_eq!(reply.status, 200, "{model} {what}: {:?}", reply.body);
            replies.push(reply);
        }
        assert_eq!(replies[0].content(), replies[1].content(), "{what}");
        assert_eq!(replies[0].body["usage"], replies[1].body["usage"], "{what}");
    }
    let status = server.status().await;
    let iree = status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i.to_string().contains("\"iree\""))
        .unwrap_or_else(|| panic!("no iree instance in {status}"))
        .to_string();
    for needle in ["backend", "iree-cache", "entries", "local-sync"] {
        assert!(iree.contains(needle), "{needle} not in {iree}");
    }
}
