//! `POST /v1/completions` through a real `switchyard serve`, driven by the real `openai` Python
//! client (`tests/clients/completions.py`), for the echo plugin and for Phi4MM on the tiny
//! fixture checkpoint; the refusals a client gets, over raw HTTP.

use serde_json::{json, Value};
use switchyard_fixtures::{fixture, manifest};
use switchyard_integration_tests::{phi4mm_lib, plugin_lib, python_with, sse_data, user, Server};

/// The real OpenAI client, pinned.
const OPENAI: &str = "openai==3.57.0";

/// What `completions.py` saw: a plain completion and the same request streamed.
async fn openai_client(
    server: &Server,
    model: &str,
    prompt: Value,
    max_tokens: u32,
    logprobs: i32,
) -> Value {
    let script =
        switchyard_integration_tests::workspace_root().join("tests/clients/completions.py");
    let base = server.base.clone();
    let model = model.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python_with(OPENAI))
            .arg(script)
            .args([base, model, prompt.to_string()])
            .args([max_tokens.to_string(), logprobs.to_string()])
            .output()
            .expect("run completions.py")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "completions.py failed:\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

fn echo_config() -> String {
    format!(
        r#"
[server.limits]
max_prompt_bytes = 64
max_tokens_limit = 100
[[plugins]]
name = "echo"
path = "{echo}"
[[models]]
name = "echo-a"
plugin = "echo"
kind = "echo"
"#,
        echo = plugin_lib("echo").display()
    )
}

#[tokio::test]
async fn echo_completions_through_the_openai_client() {
    let server = Server::start(&echo_config()).await;
    let got = openai_client(&server, "echo-a", json!("one two three"), 8, 2).await;
    assert_eq!(got["object"], "text_completion", "{got}");
    assert_eq!(got["text"], "one two three", "{got}");
    assert_eq!(got["finish_reason"], "stop");
    for (field, want) in [
        ("prompt_tokens", 3),
        ("completion_tokens", 3),
        ("total_tokens", 6),
    ] {
        assert_eq!(got["usage"][field], want, "{field}: {got}");
    }
    // Echo's distribution is a point mass on the echoed word (logprob 0, its own only
    // alternative); the offsets count characters of the completion.
    let logprobs = &got["logprobs"];
    assert_eq!(logprobs["tokens"], json!(["one", " two", " three"]));
    assert_eq!(logprobs["token_logprobs"], json!([0.0, 0.0, 0.0]));
    assert_eq!(
        logprobs["top_logprobs"],
        json!([{"one": 0.0}, {" two": 0.0}, {" three": 0.0}])
    );
    assert_eq!(logprobs["text_offset"], json!([0, 3, 7]));
    // Streamed: the same text, one chunk per token plus the finish and the usage chunk.
    assert_eq!(got["streamed"], got["text"]);
    assert_eq!(got["stream_finish"], "stop");
    assert_eq!(got["stream_usage"], got["usage"]);
    assert_eq!(got["chunks"], 5, "{got}");
    // A batch of prompts is refused by name; the client raises BadRequestError.
    assert_eq!(got["batch"]["status"], 400, "{got}");
    assert!(
        got["batch"]["message"].as_str().unwrap().contains("batch"),
        "{got}"
    );

    // Token ids: echo repeats each id as a word; max_tokens cuts it.
    let got = openai_client(&server, "echo-a", json!([5, 7, 9, 11]), 3, -1).await;
    assert_eq!(got["text"], "5 7 9", "{got}");
    assert_eq!(got["finish_reason"], "length");
    assert_eq!(got["logprobs"], Value::Null);
    assert_eq!(got["streamed"], "5 7 9");
    assert_eq!(got["stream_finish"], "length");

    // Completions are counted under their own endpoint.
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(r#"endpoint="completions",status="200""#),
        "{metrics}"
    );
}

#[tokio::test]
async fn completions_refusals_name_the_field_or_limit() {
    let server = Server::start(&echo_config()).await;
    let base = json!({"model": "echo-a", "prompt": "hello"});
    let with = |extra: Value| {
        let mut body = base.clone();
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    for (extra, param, needle) in [
        (json!({"echo": true}), "echo", "echo"),
        (json!({"prompt": ["a", "b"]}), "prompt", "batch"),
        (json!({"prompt": [[1], [2]]}), "prompt", "batch"),
        (json!({"prompt": []}), "prompt", "empty"),
        (json!({"logprobs": 21}), "logprobs", "20"),
        (json!({"n": 2}), "n", "n = 1"),
        (json!({"best_of": 3}), "best_of", "best_of"),
        (json!({"suffix": "x"}), "suffix", "suffix"),
        (json!({"temperature": 3}), "temperature", "between"),
        (json!({"max_tokens": 0}), "max_tokens", "at least 1"),
        (
            json!({"stream_options": {"include_usage": true}}),
            "stream_options",
            "stream: true",
        ),
        // OpenAI fields that would change the answer, which no model here honours.
        (
            json!({"logit_bias": {"50256": -100}}),
            "logit_bias",
            "not supported",
        ),
        (
            json!({"presence_penalty": 0.5}),
            "presence_penalty",
            "only 0",
        ),
        (
            json!({"frequency_penalty": -3}),
            "frequency_penalty",
            "only 0",
        ),
    ] {
        let (status, body) = server
            .post_json("/v1/completions", &with(extra.clone()))
            .await;
        assert_eq!(status, 400, "{extra}: {body}");
        assert_eq!(body["error"]["param"], param, "{extra}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{extra}: {message}");
    }
    // The operator caps of chat apply, each named.
    for (extra, needle) in [
        (json!({"max_tokens": 101}), "max_tokens_limit = 100"),
        (json!({"prompt": "x".repeat(65)}), "max_prompt_bytes = 64"),
        // Four bytes per id: 17 ids weigh 68 bytes.
        (json!({"prompt": vec![1; 17]}), "max_prompt_bytes = 64"),
        (
            json!({"stop": ["a", "b", "c", "d", "e"]}),
            "max_stop_sequences",
        ),
    ] {
        let (status, body) = server
            .post_json("/v1/completions", &with(extra.clone()))
            .await;
        assert_eq!(status, 400, "{extra}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{extra}: {message}");
    }
    // Unknown model: 404, as on chat; its message repeats no more of the name than a glance
    // needs (a megabyte of name got a megabyte of error).
    let (status, body) = server
        .post_json("/v1/completions", &json!({"model": "nope", "prompt": "x"}))
        .await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"nope\""),
        "{body}"
    );
    let long = "m".repeat(1 << 20);
    let (status, body) = server
        .post_json("/v1/completions", &json!({"model": long, "prompt": "x"}))
        .await;
    assert_eq!(status, 404);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.len() < 200 && message.contains("1048576 bytes"),
        "{message}"
    );
    // And the server keeps serving. OpenAI's flags are `boolean | null`, and the neutral
    // values of the refused fields are what clients send by default.
    let neutral = json!({"stream": null, "echo": null, "logit_bias": {}, "presence_penalty": 0,
                         "frequency_penalty": 0.0, "stream_options": null});
    let (status, body) = server.post_json("/v1/completions", &with(neutral)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "hello");
    let reply = server
        .chat(json!({"model": "echo-a", "messages": user("still here")}))
        .await;
    assert_eq!(reply.content(), "still here");
}

/// A 2.0 plugin's export glue would never look for the prompt, so the host refuses completions
/// for its models itself, naming the versions, and its chat keeps working; a client cannot pass
/// the host's own option key to any endpoint.
#[tokio::test]
async fn completions_for_a_2_0_plugin_are_refused_by_the_host_and_the_prompt_key_is_reserved() {
    let config = format!(
        r#"
[[plugins]]
name = "echo"
path = "{echo}"
[[plugins]]
name = "echo-2-0"
path = "{echo_2_0}"
[[models]]
name = "echo-a"
plugin = "echo"
kind = "echo"
[[models]]
name = "old"
plugin = "echo-2-0"
kind = "echo"
"#,
        echo = plugin_lib("echo").display(),
        echo_2_0 = plugin_lib("echo_2_0").display(),
    );
    let server = Server::start(&config).await;
    let (status, body) = server
        .post_json(
            "/v1/completions",
            &json!({"model": "old", "prompt": "hello"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "unsupported", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("2.0") && message.contains("2.1"),
        "{message}"
    );
    let reply = server
        .chat(json!({"model": "old", "messages": user("still a chat")}))
        .await;
    assert_eq!(reply.content(), "still a chat");
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "echo-a", "messages": user("hi"),
                   "model_options": {"switchyard.prompt": "forged"}}),
        ),
        (
            "/v1/completions",
            json!({"model": "echo-a", "prompt": "hi",
                   "model_options": {"switchyard.prompt": "forged"}}),
        ),
    ] {
        let (status, reply) = server.post_json(path, &body).await;
        assert_eq!(status, 400, "{path}: {reply}");
        assert_eq!(reply["error"]["param"], "model_options", "{path}: {reply}");
    }
}

fn phi4mm_config() -> String {
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

/// The fixture's `special_tokens_literal` tokenizer case is a rendered system + user chat; its
/// ids up to and including `<|assistant|>` are the chat template's prompt for those messages
/// with the generation prompt.
fn chat_template_ids() -> Vec<u64> {
    let case = manifest()["tokenizer"]["tokenizer_cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "special_tokens_literal")
        .unwrap();
    let tokens = case["tokens"].as_array().unwrap();
    let end = tokens.iter().position(|t| t == "<|assistant|>").unwrap();
    case["ids"].as_array().unwrap()[..=end]
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn phi4mm_completion_of_the_template_ids_equals_the_chat() {
    let server = Server::start(&phi4mm_config()).await;
    let ids = chat_template_ids();
    let messages = json!([{"role": "system", "content": "You are a helpful assistant."},
                          {"role": "user", "content": "Hi there"}]);
    let chat = server
        .chat(
            json!({"model": "phi4mm-tiny", "messages": messages, "max_tokens": 6,
                     "temperature": 0, "logprobs": true, "top_logprobs": 3}),
        )
        .await;
    assert_eq!(chat.status, 200, "{:?}", chat.body);
    // The ids are this chat's prompt.
    assert_eq!(chat.body["usage"]["prompt_tokens"], ids.len());

    let got = openai_client(&server, "phi4mm-tiny", json!(ids), 6, 3).await;
    assert_eq!(got["text"], chat.content(), "{got}");
    assert_eq!(
        got["finish_reason"],
        chat.body["choices"][0]["finish_reason"]
    );
    assert_eq!(got["usage"]["prompt_tokens"], ids.len());
    assert_eq!(
        got["usage"]["completion_tokens"],
        chat.body["usage"]["completion_tokens"]
    );
    assert_eq!(got["streamed"], got["text"]);
    assert_eq!(got["stream_usage"], got["usage"]);
    // The same tokens with the same log probabilities as the chat's.
    let chat_logprobs = chat.body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    let token_logprobs = got["logprobs"]["token_logprobs"].as_array().unwrap();
    assert_eq!(token_logprobs.len(), chat_logprobs.len());
    for (i, (legacy, chat)) in token_logprobs.iter().zip(chat_logprobs).enumerate() {
        assert_eq!(got["logprobs"]["tokens"][i], chat["token"], "token {i}");
        assert_eq!(*legacy, chat["logprob"], "token {i}");
        let top = got["logprobs"]["top_logprobs"][i].as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "token {i}: {top:?}");
    }
}

#[tokio::test]
async fn phi4mm_text_prompts_are_plain_text_and_ids_are_checked() {
    let server = Server::start(&phi4mm_config()).await;
    let tokens = |prompt: Value| {
        let body = json!({"model": "phi4mm-tiny", "prompt": prompt, "max_tokens": 2,
                          "temperature": 0});
        let server = &server;
        async move { server.post_json("/v1/completions", &body).await }
    };
    // "Hi there" is three tokens in the fixture's tokenizer case ('H', 'i', 'Ġthere').
    let (status, body) = tokens(json!("Hi there")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 3, "{body}");
    assert_eq!(body["object"], "text_completion");
    // A special token's spelling in text stays text: "<|end|>" is not the one id 1020 but
    // several ordinary tokens.
    let (status, body) = tokens(json!("Hi there<|end|>")).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["usage"]["prompt_tokens"].as_u64().unwrap() > 4,
        "{body}"
    );
    // Ids: within the vocabulary, and no media placeholder without its medium.
    let ids = &manifest()["token_ids"];
    let vocab = ids["vocab_size"].as_u64().unwrap();
    let (status, body) = tokens(json!([1, vocab])).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("outside the vocabulary"), "{message}");
    let image = ids["<|endoftext10|> image placeholder"].as_u64().unwrap();
    let (status, body) = tokens(json!([1, image])).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("placeholder"), "{message}");
    let (status, body) = tokens(json!("")).await;
    assert_eq!(status, 400, "{body}");
    // Still serving.
    let (status, _) = tokens(json!([1, 2, 3])).await;
    assert_eq!(status, 200);
}

/// `text_offset[i]` is where token i's text begins in the completion, also while the plugin
/// holds text back because it may begin a stop string (it is sent with a later token): a stop
/// string that never matches changes neither the text nor the offsets, streamed or not.
#[tokio::test]
async fn phi4mm_text_offsets_locate_each_token_while_text_is_held_back() {
    let server = Server::start(&phi4mm_config()).await;
    let complete = |stop: Option<String>, stream: bool| {
        let mut body = json!({"model": "phi4mm-tiny", "prompt": [1, 2, 3], "max_tokens": 6,
                              "temperature": 0, "logprobs": 2, "stream": stream});
        if let Some(stop) = stop {
            body["stop"] = json!(stop);
        }
        let request = server
            .http
            .post(format!("{}/v1/completions", server.base))
            .json(&body);
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200);
            let raw = response.text().await.unwrap();
            // (text, tokens, offsets), from the answer or from its chunks.
            let (mut text, mut tokens, mut offsets) = (String::new(), Vec::new(), Vec::new());
            let answers: Vec<Value> = if stream {
                sse_data(&raw)
            } else {
                vec![serde_json::from_str(&raw).unwrap()]
            };
            for answer in answers {
                let Some(choice) = answer["choices"].get(0) else {
                    continue;
                };
                text += choice["text"].as_str().unwrap();
                if let Some(logprobs) = choice["logprobs"].as_object() {
                    for (t, o) in logprobs["tokens"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .zip(logprobs["text_offset"].as_array().unwrap())
                    {
                        tokens.push(t.as_str().unwrap().to_string());
                        offsets.push(o.as_u64().unwrap() as usize);
                    }
                }
            }
            (text, tokens, offsets)
        }
    };
    let (text, tokens, offsets) = complete(None, false).await;
    assert_eq!(tokens.len(), 6, "{tokens:?}");
    let chars: Vec<char> = text.chars().collect();
    for (token, &offset) in tokens.iter().zip(&offsets) {
        let at: String = chars[offset..].iter().take(token.chars().count()).collect();
        assert_eq!(&at, token, "{text:?}: {tokens:?} at {offsets:?}");
    }
    // A stop string that begins with a token's text (held back each time the text ends with
    // it) and ends in a character the text does not hold (so it never matches).
    let held = tokens
        .iter()
        .find(|t| t.chars().count() >= 2)
        .expect("a token of two characters or more");
    let stop = format!("{held}\u{7}");
    assert!(!text.contains(&stop));
    for stream in [false, true] {
        let got = complete(Some(stop.clone()), stream).await;
        assert_eq!(
            got,
            (text.clone(), tokens.clone(), offsets.clone()),
            "stream: {stream}"
        );
    }
    // Without log probabilities, a token whose text is held back sends no chunk: every chunk
    // but the finishing one has text, and together they are the answer.
    let body = json!({"model": "phi4mm-tiny", "prompt": [1, 2, 3], "max_tokens": 6,
                      "temperature": 0, "stream": true, "stop": stop});
    let raw = server
        .http
        .post(format!("{}/v1/completions", server.base))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let chunks = sse_data(&raw);
    let (mut joined, mut empty) = (String::new(), 0);
    for chunk in &chunks {
        let choice = &chunk["choices"][0];
        let piece = choice["text"].as_str().unwrap();
        if piece.is_empty() && choice["finish_reason"].is_null() {
            empty += 1;
        }
        joined += piece;
    }
    assert_eq!(empty, 0, "{raw}");
    assert_eq!(joined, text, "{raw}");
}
