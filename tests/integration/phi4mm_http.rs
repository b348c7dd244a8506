//! Phi4MM end to end through a real `switchyard serve`: the real plugin library, the tiny fixture
//! checkpoint, real HTTP over loopback. Random weights make the words gibberish, so these tests
//! check the plumbing (every modality, both endpoints, streaming, disconnect), not the text;
//! numerical exactness is checked against the fixture in `crates/phi4mm/tests/`.

use base64::Engine as _;
use serde_json::json;
use std::time::Duration;
use switchyard_fixtures::{fixture, manifest, model_cases};
use switchyard_integration_tests::{phi4mm_lib, ChatReply, Server};

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
        lib = phi4mm_lib().display(),
        ckpt = fixture().join("model").display()
    )
}

/// A 400 that names the refused content part in `param`, with a message that starts with
/// `starts` (the medium, as the plugin counts it) and holds `holds`.
fn assert_part_refused(reply: &ChatReply, param: &str, starts: &str, holds: &str) {
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert_eq!(reply.body["error"]["param"], param, "{:?}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(starts) && message.contains(holds),
        "{message}"
    );
}

fn input(name: &str) -> String {
    let bytes = std::fs::read(fixture().join("inputs").join(name)).unwrap();
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

    let wav = std::fs::read(fixture().join("inputs/audio_16k.wav")).unwrap();
    let (status, body) = server
        .transcribe("phi4mm-tiny", "clip.wav", wav.clone(), &[])
        .await;
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(body["text"].is_string(), "{body}");
    let (_, text) = server
        .transcribe("phi4mm-tiny", "clip.wav", wav, &[("stream", "true")])
        .await;
    assert!(text.contains("transcript.text.done"), "{text}");

    // Malformed media: a clear 400 whose `param` names the content part, and the instance keeps
    // serving. A header that does not read is refused at admission.
    let png = std::fs::read(fixture().join("inputs/img_small.png")).unwrap();
    let good = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&png)
    );
    let bad = json!({"model": "phi4mm-tiny", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "compare"},
        {"type": "image_url", "image_url": {"url": good}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]});
    assert_part_refused(
        &server.chat(bad).await,
        "messages[0].content[2]",
        "image 1: ",
        "",
    );
    // Media whose header reads but whose data does not decode fails after admission, while the
    // plugin prepares it: streamed or not, the answer is the same 400 (not a 200 and an error
    // event), for the status waits for the request to start.
    let cut = base64::engine::general_purpose::STANDARD.encode(&png[..png.len() / 2]);
    for stream in [false, true] {
        let body = json!({"model": "phi4mm-tiny", "stream": stream, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "image_url",
                         "image_url": {"url": format!("data:image/png;base64,{cut}")}}]}]});
        let reply = server.chat(body).await;
        assert_part_refused(&reply, "messages[1].content[0]", "image 0: ", "");
    }
    // A clip whose header is sound and whose samples are not: one NaN in a second of floats.
    let mut nan = switchyard_fixtures::crafted::wav_header(16000, 1, 32, 3, 16000 * 4);
    for i in 0..16000 {
        let sample = if i == 8000 { f32::NAN } else { 0.0 };
        nan.extend_from_slice(&sample.to_le_bytes());
    }
    for stream in ["false", "true"] {
        let (status, body) = server
            .transcribe("phi4mm-tiny", "nan.wav", nan.clone(), &[("stream", stream)])
            .await;
        assert_eq!(status, 400, "stream {stream}: {body}");
        assert!(body.contains("not finite"), "stream {stream}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["param"], "file", "stream {stream}: {body}");
    }
    // The same clip as a chat's second audio part: its place is the error's `param`.
    let clip = |data: &[u8]| {
        json!({"type": "input_audio", "input_audio": {
        "data": base64::engine::general_purpose::STANDARD.encode(data), "format": "wav"}})
    };
    let sound = std::fs::read(fixture().join("inputs/audio_16k.wav")).unwrap();
    let reply = server
        .chat(
            json!({"model": "phi4mm-tiny", "messages": [{"role": "user", "content": [
            clip(&sound), {"type": "text", "text": "and"}, clip(&nan)]}]}),
        )
        .await;
    assert_part_refused(&reply, "messages[0].content[2]", "audio 1: ", "not finite");
    let reply = server.chat(json!({"model": "phi4mm-tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "ok"}]})).await;
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_frees_its_slot() {
    let server = Server::start(&config()).await;
    let body = json!({"model": "phi4mm-tiny", "stream": true, "max_tokens": 2000, "temperature": 0,
                      "messages": [{"role": "user", "content": "Tell me a long story."}]});
    let stream = server.open_stream(body).await;
    // The host sends the role chunk at once; wait until the request holds a slot in the plugin.
    let status = server
        .status_until("the request running", |s| {
            s["instances"][0]["stats"]["running"] == 1
        })
        .await;
    let during = &status["instances"][0];
    assert_eq!(during["in_flight"], 1, "{during}");
    assert_eq!(during["stats"]["running"], 1, "{during}");
    assert_eq!(during["stats"]["free_slots"], 1, "{during}");
    drop(stream);
    server
        .status_until("the slot freed after the client left", |s| {
            let i = &s["instances"][0];
            i["in_flight"] == 0 && i["stats"]["running"] == 0 && i["stats"]["free_slots"] == 2
        })
        .await;
}

/// The IREE backend behind the same HTTP API: every modality answers exactly as the host backend
/// does (greedy, same tokens), and `/admin/status` shows the backend and its artifact cache.
#[cfg(feature = "iree")]
#[tokio::test]
async fn the_iree_backend_answers_like_the_host_backend() {
    // The artifact cache the plugin's own IREE tests fill, and the same decoder shape as theirs
    // (the checkpoint's whole context, no `iree.context`), so the modules are compiled once per
    // test run. The settings name no cache: the plugin keeps its modules under the host's
    // `server.cache_dir` (`plugins/phi4mm/iree`), here a link to the shared cache.
    let cache = crate::shared_iree_cache();
    let dir = switchyard_integration_tests::TempDir::new("iree-http");
    let plugin_cache = dir.path().join("cache/switchyard/plugins/phi4mm");
    std::fs::create_dir_all(&plugin_cache).unwrap();
    std::os::unix::fs::symlink(&cache, plugin_cache.join("iree")).unwrap();
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
settings = {{ checkpoint = "{ckpt}", slots = 2, default_max_tokens = 6, backend = "iree" }}
"#,
        lib = phi4mm_lib().display(),
        ckpt = fixture().join("model").display(),
    );
    let server = Server::start_in(dir, &config).await;
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
    let served_from = plugin_cache.join("iree").display().to_string();
    for needle in [
        "backend",
        "\"cache\"",
        "entries",
        "local-task",
        &served_from,
    ] {
        assert!(iree.contains(needle), "{needle} not in {iree}");
    }
}

/// The MLX producer behind the same HTTP API: an instance with `producer = "mlx"` (MLX embeds the
/// ids and runs the vision tower) answers an image and an image+audio request exactly as the host
/// producer does (greedy, same tokens), and `/admin/status` names its producer.
#[cfg(feature = "mlx")]
#[tokio::test]
async fn the_mlx_producer_answers_like_the_host_producer() {
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
name = "mlx"
plugin = "phi4mm"
kind = "phi4mm"
settings = {{ checkpoint = "{ckpt}", slots = 2, default_max_tokens = 6, producer = "mlx" }}
"#,
        lib = phi4mm_lib().display(),
        ckpt = fixture().join("model").display(),
    );
    let server = Server::start(&config).await;
    let image = json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", input("img_wide.png"))}});
    let audio = json!({"type": "input_audio", "input_audio": {"data": input("audio_16k.wav"), "format": "wav"}});
    let text = json!({"type": "text", "text": "What is this?"});
    for (what, content) in [
        ("image", json!([text, image])),
        ("image+audio", json!([text, image, audio])),
    ] {
        let mut replies = Vec::new();
        for model in ["host", "mlx"] {
            let body = json!({"model": model, "max_tokens": 6, "temperature": 0, "logprobs": true,
                              "return_tokens_as_token_ids": true,
                              "messages": [{"role": "user", "content": content}]});
            let reply = server.chat(body).await;
            assert_eq!(reply.status, 200, "{model} {what}: {:?}", reply.body);
            replies.push(reply);
        }
        assert_eq!(replies[0].content(), replies[1].content(), "{what}");
        assert_eq!(replies[0].body["usage"], replies[1].body["usage"], "{what}");
        let tokens = |r: &switchyard_integration_tests::ChatReply| {
            r.body["choices"][0]["logprobs"]["content"]
                .as_array()
                .unwrap_or_else(|| panic!("{what}: no logprobs in {:?}", r.body))
                .iter()
                .map(token_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            tokens(&replies[0]),
            tokens(&replies[1]),
            "{what}: token ids"
        );
    }
    let status = server.status().await;
    let producers: Vec<(&str, &str)> = status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let producer = &i["stats"]["details"]["producer"];
            (
                i["name"].as_str().unwrap(),
                producer.as_str().unwrap_or("?"),
            )
        })
        .collect();
    assert!(producers.contains(&("mlx", "mlx")), "{producers:?}");
    assert!(producers.contains(&("host", "host")), "{producers:?}");
}

/// The fixture's reference for one single-row case.
struct Case {
    name: String,
    input_ids: Vec<u64>,
    /// `none`, `speech` or `vision` (the fixture's `__base__` is no adapter).
    adapter: String,
    images: Vec<String>,
    audios: Vec<String>,
    greedy: Vec<u64>,
    /// log-softmax of the reference `logits_first`, in f64.
    logprobs_first: Vec<f64>,
}

fn case(name: &str) -> Case {
    let manifest = manifest();
    let c = &manifest["model_cases"]["cases"][name];
    let ids = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .unwrap_or_else(|| panic!("{name}: {v}"))
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let names = |v: &serde_json::Value, key: Option<&str>| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| key.map_or(x, |k| &x[k]).as_str().unwrap().to_string())
            .collect()
    };
    let (logits, _) = model_cases().f32(&format!("{name}.logits_first"));
    let logits: Vec<f64> = logits.into_iter().map(f64::from).collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
    Case {
        name: name.into(),
        input_ids: ids(&c["input_ids"]),
        adapter: match c["adapter"].as_str().unwrap() {
            "__base__" => "none".into(),
            other => other.into(),
        },
        images: names(&c["images"], Some("name")),
        audios: names(&c["audios"], None),
        greedy: ids(&c["greedy_tokens"]),
        logprobs_first: logits.iter().map(|l| l - lse).collect(),
    }
}

/// A row of a fixture case as a chat request: its ids and adapter pinned through
/// `model_options`, its media as content parts, greedy, with log probabilities and token ids.
fn row_request(case: &Case, max_tokens: usize) -> serde_json::Value {
    let mut content: Vec<serde_json::Value> = case
        .images
        .iter()
        .map(|n| json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", input(&format!("{n}.png")))}}))
        .collect();
    content.extend(case.audios.iter().map(|n| {
        json!({"type": "input_audio", "input_audio": {"data": input(&format!("{n}.wav")), "format": "wav"}})
    }));
    json!({
        "model": "phi4mm-tiny", "temperature": 0, "max_tokens": max_tokens,
        "logprobs": true, "top_logprobs": 5, "return_tokens_as_token_ids": true,
        "messages": [{"role": "user", "content": content}],
        "model_options": {"input_ids": case.input_ids, "adapter": case.adapter},
    })
}

/// One answered row: per generated token its id, its logprob and the top-5 (id, logprob).
#[derive(Debug)]
struct Row {
    tokens: Vec<u64>,
    logprobs: Vec<f64>,
    top: Vec<Vec<(u64, f64)>>,
}

fn token_id(entry: &serde_json::Value) -> u64 {
    let token = entry["token"].as_str().unwrap();
    token
        .strip_prefix("token_id:")
        .unwrap_or_else(|| panic!("not a token id: {token}"))
        .parse()
        .unwrap()
}

fn answered(case: &Case, reply: &switchyard_integration_tests::ChatReply) -> Row {
    assert_eq!(reply.status, 200, "{}: {:?}", case.name, reply.body);
    let content = reply.body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no logprobs in {}", case.name, reply.body));
    Row {
        tokens: content.iter().map(token_id).collect(),
        logprobs: content
            .iter()
            .map(|e| e["logprob"].as_f64().unwrap())
            .collect(),
        top: content
            .iter()
            .map(|e| {
                e["top_logprobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| (token_id(t), t["logprob"].as_f64().unwrap()))
                    .collect()
            })
            .collect(),
    }
}

/// The fixture's float32 tolerance for logits, `1e-4 + 1e-4·|ref|`, doubled in its absolute part
/// for log probabilities: a logprob is a logit minus the log-sum-exp of all logits, and each of
/// the two may be off by the logit tolerance.
fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 2e-4 + 1e-4 * want.abs()
}

/// The first step of a row against the fixture: the sampled token's logprob and the top 5
/// (ids and values) against the log-softmax of the reference logits.
fn assert_first_step_matches_reference(case: &Case, row: &Row, what: &str) {
    let want = |id: u64| case.logprobs_first[id as usize];
    assert!(
        close(row.logprobs[0], want(row.tokens[0])),
        "{what} {}: first logprob {} vs reference {}",
        case.name,
        row.logprobs[0],
        want(row.tokens[0])
    );
    let mut reference: Vec<(u64, f64)> = (0..case.logprobs_first.len() as u64)
        .map(|id| (id, want(id)))
        .collect();
    reference.sort_by(|a, b| b.1.total_cmp(&a.1));
    let ids: Vec<u64> = row.top[0].iter().map(|t| t.0).collect();
    let ref_ids: Vec<u64> = reference[..5].iter().map(|t| t.0).collect();
    assert_eq!(
        ids, ref_ids,
        "{what} {}: top-5 ids of the first step",
        case.name
    );
    for &(id, lp) in &row.top[0] {
        assert!(
            close(lp, want(id)),
            "{what} {}: token {id}: {lp} vs {}",
            case.name,
            want(id)
        );
    }
}

/// Two answers of the same row: the same tokens, every step's logprobs within the tolerance
/// (the top-5 compared by rank, so two near-tied alternatives may swap ids).
fn assert_same_row(case: &Case, solo: &Row, batched: &Row) {
    assert_eq!(
        batched.tokens, solo.tokens,
        "{}: batched vs solo",
        case.name
    );
    for (step, (b, s)) in batched.logprobs.iter().zip(&solo.logprobs).enumerate() {
        assert!(close(*b, *s), "{} step {step}: {b} vs {s}", case.name);
        for (bt, st) in batched.top[step].iter().zip(&solo.top[step]) {
            assert!(
                close(bt.1, st.1),
                "{} step {step}: top {bt:?} vs {st:?}",
                case.name
            );
        }
    }
}

/// Decoder steps so far that carried `rows` rows, from the instance's stats.
async fn steps_with_rows(server: &Server, rows: usize) -> u64 {
    let status = server.status().await;
    status["instances"][0]["stats"]["details"]["steps_by_rows"][rows - 1]
        .as_u64()
        .unwrap_or_else(|| panic!("no steps_by_rows in {status}"))
}

/// Waits until the instance holds `rows` more requests, queued or running, than `released`
/// counted as finished (at most 60 s): the rows sent since have been admitted, or have ended.
async fn wait_until_admitted(server: &Server, rows: u64, released: u64) {
    server
        .status_until(&format!("{rows} rows admitted"), |status| {
            let instance = &status["instances"][0];
            let count = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
            let held = count(&instance["stats"]["running"]) + count(&instance["stats"]["queued"]);
            held + count(&instance["admissions_released"]) - released >= rows
        })
        .await;
}

/// Both `mixed_batches` of the fixture through `switchyard serve`: each row — its fixture ids,
/// media and adapter pinned through `model_options` — alone, then all rows of the batch at once,
/// decoding in one batch with a different adapter per row. Every row's tokens equal its solo run
/// and the reference, its logprobs the solo run's and, at the first step, the reference's.
#[tokio::test]
async fn the_fixture_mixed_batches_over_http_match_their_solo_runs_and_the_reference() {
    // Longer than the fixture's 8 tokens, so the rows of a batch overlap for many steps; the
    // first 8 are checked against the reference, all of them against the solo run.
    const MAX_TOKENS: usize = 32;
    let config = config().replace("slots = 2", "slots = 3").replace(
        "default_max_tokens = 8",
        "default_max_tokens = 8, prefill_chunk = 64",
    );
    let server = Server::start(&config).await;
    let manifest = manifest();
    for batch in ["mixed_audio_text", "mixed_image_text"] {
        let spec = &manifest["mixed_batches"][batch];
        let cases: Vec<Case> = spec["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| case(r.as_str().unwrap()))
            .collect();
        let mut solo = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let row = answered(c, &server.chat(row_request(c, MAX_TOKENS)).await);
            let reference = spec["greedy_tokens_per_row"][i].as_array().unwrap();
            let reference: Vec<u64> = reference.iter().map(|t| t.as_u64().unwrap()).collect();
            assert_eq!(
                reference, c.greedy,
                "{batch}: the fixture's row {i} is its case"
            );
            assert_eq!(row.tokens[..8], c.greedy[..], "{batch} solo {}", c.name);
            assert_first_step_matches_reference(c, &row, "solo");
            solo.push(row);
        }
        // Concurrent requests share decoder steps as soon as they are prepared; the instance's
        // step counts prove it (a retry covers the unlikely run where they never meet). The rows
        // with media go first: their large bodies are parsed off the async threads and their
        // media prepared on the instance's one media thread, so text rows sent at the same time
        // would be admitted, prepared and finished before them. Text rows sent once the media
        // rows are admitted are prepared behind them on that thread, and join their prefill.
        let media_first = |c: &&Case| !c.images.is_empty() || !c.audios.is_empty();
        let mut met = false;
        for _attempt in 0..5 {
            let before = steps_with_rows(&server, cases.len()).await;
            let (media, text): (Vec<_>, Vec<_>) =
                cases.iter().enumerate().partition(|(_, c)| media_first(c));
            let send = |rows: Vec<(usize, &Case)>| {
                futures_util::future::join_all(rows.into_iter().map(|(i, c)| {
                    let reply = server.chat(row_request(c, MAX_TOKENS));
                    async move { (i, reply.await) }
                }))
            };
            let media_count = media.len() as u64;
            let released = server.status().await["instances"][0]["admissions_released"]
                .as_u64()
                .expect("admissions_released in /admin/status");
            let (media_replies, text_replies) = futures_util::future::join(send(media), async {
                wait_until_admitted(&server, media_count, released).await;
                send(text).await
            })
            .await;
            let mut replies: Vec<_> = media_replies.into_iter().chain(text_replies).collect();
            replies.sort_by_key(|(i, _)| *i);
            let replies: Vec<_> = replies.into_iter().map(|(_, r)| r).collect();
            let together = steps_with_rows(&server, cases.len()).await - before;
            for ((c, reply), solo) in cases.iter().zip(&replies).zip(&solo) {
                let batched = answered(c, reply);
                assert_same_row(c, solo, &batched);
                assert_first_step_matches_reference(c, &batched, "batched");
            }
            eprintln!(
                "{batch}: {together} decoder steps carried all {} rows",
                cases.len()
            );
            if together > 0 {
                met = true;
                break;
            }
        }
        assert!(
            met,
            "{batch}: the rows never shared a decoder step in 5 attempts"
        );
    }
}

/// A relative `checkpoint` means relative to the config file, like the host's plugin paths —
/// not to the directory the server was started in.
#[tokio::test]
async fn a_relative_checkpoint_path_resolves_against_the_config_file() {
    let dir = switchyard_integration_tests::TempDir::new("phi4mm-relative");
    std::fs::create_dir(dir.path().join("models")).unwrap();
    std::os::unix::fs::symlink(fixture().join("model"), dir.path().join("models/tiny")).unwrap();
    let absolute = fixture().join("model").display().to_string();
    let config = config().replace(&absolute, "models/tiny");
    assert!(config.contains("checkpoint = \"models/tiny\""), "{config}");
    let server = Server::start_in(dir, &config).await;
    let reply = server
        .chat(json!({"model": "phi4mm-tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
}

/// `model_options` that phi4mm refuses, each with a 400 naming the problem; the instance keeps
/// serving.
#[tokio::test]
async fn bad_model_options_are_refused_clearly() {
    let server = Server::start(&config()).await;
    let text = |options: serde_json::Value, content: serde_json::Value| {
        json!({"model": "phi4mm-tiny", "max_tokens": 2, "model_options": options,
               "messages": [{"role": "user", "content": content}]})
    };
    for (body, needle) in [
        (text(json!({"adapter": "audio"}), json!("hi")), "audio"),
        (text(json!({"adaptor": "speech"}), json!("hi")), "adaptor"),
        (
            text(json!({"input_ids": [1021, 5, 1020, 1019]}), json!("hi")),
            "replaces the text",
        ),
        (text(json!({"input_ids": []}), json!([])), "empty"),
        // One audio placeholder id, no clip: the counts disagree.
        (
            text(json!({"input_ids": [1021, 1011, 1020, 1019]}), json!([])),
            "placeholder",
        ),
        (
            text(json!({"input_ids": [1021, 99999, 1020, 1019]}), json!([])),
            "vocabulary",
        ),
    ] {
        let reply = server.chat(body.clone()).await;
        assert_eq!(reply.status, 400, "{body}: {:?}", reply.body);
        let message = reply.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
    let reply = server
        .chat(text(
            json!({"input_ids": [1021, 5, 6, 1020, 1019], "adapter": "vision"}),
            json!([]),
        ))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.body["usage"]["prompt_tokens"], 5);
}

/// No client states a transcript's length: its budget follows the clip (a token per token of
/// its prompt, at least the model's `default_max_tokens`), within the instance's
/// `max_tokens_limit`, and neither default cuts it short. (It stopped at `default_max_tokens`,
/// a few minutes of speech at the default of 256, with nothing to say it was cut.)
#[tokio::test]
async fn a_transcriptions_budget_follows_its_clip_within_the_cap() {
    let config = format!(
        r#"
[server.limits]
default_max_tokens = 6
[[plugins]]
name = "phi4mm"
path = "{lib}"
[[models]]
name = "clip"
plugin = "phi4mm"
kind = "phi4mm"
settings = {{ checkpoint = "{ckpt}", slots = 1, default_max_tokens = 8 }}
[[models]]
name = "capped"
plugin = "phi4mm"
kind = "phi4mm"
limits = {{ max_tokens_limit = 20, default_max_tokens = 6 }}
settings = {{ checkpoint = "{ckpt}", slots = 1, default_max_tokens = 8 }}
"#,
        lib = phi4mm_lib().display(),
        ckpt = fixture().join("model").display()
    );
    let server = Server::start(&config).await;
    let wav = std::fs::read(fixture().join("inputs/audio_long_16k.wav")).unwrap();
    let usage = |body: &str| {
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        let usage = &body["usage"];
        (
            usage["input_tokens"].as_u64().unwrap(),
            usage["output_tokens"].as_u64().unwrap(),
        )
    };
    let (status, body) = server
        .transcribe("clip", "clip.wav", wav.clone(), &[])
        .await;
    assert_eq!(status, 200, "{body}");
    let (input, output) = usage(&body);
    assert!(output > 8 && output <= input, "{body}");
    let (status, body) = server.transcribe("capped", "clip.wav", wav, &[]).await;
    assert_eq!(status, 200, "{body}");
    let (_, output) = usage(&body);
    assert!(output > 8 && output <= 20, "{body}");
    // A chat still gets the defaults.
    let reply = server
        .chat(json!({"model": "clip", "temperature": 0,
                     "messages": [{"role": "user", "content": "Hello"}]}))
        .await;
    assert_eq!(
        reply.body["usage"]["completion_tokens"], 6,
        "{:?}",
        reply.body
    );
}

/// A streamed answer's status waits for the model to start the request: a stream queued behind
/// a busy slot has no headers yet, a client that leaves while queued frees its place at once,
/// and one that waits gets its 200 and its stream when the slot frees.
#[tokio::test]
async fn a_queued_stream_starts_when_its_slot_frees_and_leaving_the_queue_frees_its_place() {
    let config = config().replace("slots = 2", "slots = 1");
    let server = Server::start(&config).await;
    let body = |tokens: u32| {
        json!({"model": "phi4mm-tiny", "stream": true, "max_tokens": tokens, "temperature": 0,
               "messages": [{"role": "user", "content": "Tell me a long story."}]})
    };
    let wait_for = |what: &'static str, test: fn(&serde_json::Value) -> bool| {
        server.status_until(what, move |status| test(&status["instances"][0]))
    };
    // The slot's holder: a long stream, read slowly (2000 tokens: about 2 s on two cores, and
    // room left in the KV pool, one row of 4096 positions, for the others to queue rather than
    // be refused).
    let holder = server.open_stream(body(2000)).await;
    wait_for("the holder runs", |i| i["stats"]["running"] == 1).await;
    // A second stream queues: no status yet. Its client gives up.
    let request = server
        .http
        .post(format!("{}/v1/chat/completions", server.base))
        .json(&body(4));
    let queued = tokio::spawn(async move { request.send().await.map(|r| r.status()) });
    wait_for("the second waits", |i| i["stats"]["queued"] == 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!queued.is_finished(), "a status came before the start");
    queued.abort();
    wait_for("leaving the queue frees its place", |i| {
        i["stats"]["queued"] == 0 && i["in_flight"] == 1
    })
    .await;
    // A third waits it out: when the holder leaves, it starts and streams to the end.
    let waiter = server.chat_stream(body(4));
    let (reply, ()) = tokio::join!(waiter, async {
        wait_for("the third waits", |i| i["stats"]["queued"] == 1).await;
        drop(holder);
    });
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert!(reply.done, "{}", reply.raw);
    wait_for("all done", |i| {
        i["in_flight"] == 0 && i["stats"]["running"] == 0
    })
    .await;
}

/// Requests that run past `request_timeout_secs` end with the host's 504, also when the plugin,
/// which got the same deadline, notices it first and cancels them (that was a 408 "cancelled"
/// now and then).
#[tokio::test]
async fn requests_past_the_deadline_get_504_whoever_notices_first() {
    let config = config().replace("slots = 2", "slots = 4").replace(
        "[[plugins]]",
        "[server]\nrequest_timeout_secs = 0.3\n[[plugins]]",
    );
    let server = Server::start(&config).await;
    for _ in 0..3 {
        // The last round's rows give their KV back when the plugin has ended them.
        server
            .status_until("the last round's rows ended", |s| {
                let stats = &s["instances"][0]["stats"];
                stats["running"] == 0 && stats["queued"] == 0
            })
            .await;
        let running: Vec<_> = (0..4)
            .map(|_| {
                let body = json!({"model": "phi4mm-tiny", "max_tokens": 3000, "temperature": 0,
                    "messages": [{"role": "user", "content": "Tell me a long story."}]});
                let request = server
                    .http
                    .post(format!("{}/v1/chat/completions", server.base))
                    .json(&body);
                tokio::spawn(async move {
                    let response = request.send().await.unwrap();
                    (response.status().as_u16(), response.text().await.unwrap())
                })
            })
            .collect();
        for request in running {
            let (status, text) = request.await.unwrap();
            assert_eq!(status, 504, "{text}");
            assert!(text.contains("request_timeout"), "{text}");
        }
    }
}
