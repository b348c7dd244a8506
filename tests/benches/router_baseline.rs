//! The router-overhead benchmark's baseline: a minimal axum server that does the work of a
//! non-streaming chat request through Switchyard and the echo plugin, and nothing of the router
//! (no route table, admission, plugin ABI, event channel or metrics). Per request it:
//!
//! - parses the OpenAI JSON body into typed structs (model, messages with string or parts
//!   content, stream, max_tokens) and builds the plugin-API `Request` from it, as the host does;
//! - echoes the words of the last user message as a stream of tokens (`"w0"`, `" w1"`, ...),
//!   each an owned string as the plugin's events are, honouring `max_tokens`;
//! - builds the same `chat.completion` JSON (id, created, model, message, logprobs,
//!   finish_reason, usage) with `serde_json::json!`, as a minimal server would write it; or,
//!   with `typed` as its second argument, serialises it from borrowed, typed structs, as the
//!   host does (`scripts/profile-router.sh baseline-typed` counts what that saves).
//!
//! Usage: `router-baseline 127.0.0.1:PORT [json|typed]`. Run by `scripts/bench-router.sh`.

use axum::{
    body::Bytes,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use futures_util::{stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};
use switchyard_plugin_api::{Endpoint, Message, Part, Request, Role};

#[derive(Deserialize)]
struct ChatBody {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    max_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Content,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<TextPart>),
}

#[derive(Deserialize)]
struct TextPart {
    text: String,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static ID_PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
/// The answer is serialised from [`TypedAnswer`] rather than built with `json!`.
static TYPED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

#[derive(Serialize)]
struct TypedAnswer<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [TypedChoice<'a>; 1],
    usage: TypedUsage,
}

#[derive(Serialize)]
struct TypedChoice<'a> {
    index: u32,
    message: TypedMessage<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct TypedMessage<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct TypedUsage {
    prompt_tokens: u32,
    completion_tokens: u32,
    total_tokens: u32,
}

fn bad_request(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": {"message": message}})),
    )
        .into_response()
}

/// The plugin-API request the host would hand the plugin.
fn to_request(id: u64, body: &ChatBody) -> Result<Request, String> {
    let mut messages = Vec::with_capacity(body.messages.len());
    for m in &body.messages {
        let role = match m.role.as_str() {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => return Err(format!("unknown role {other:?}")),
        };
        let parts: Vec<Part> = match &m.content {
            Content::Text(text) => vec![Part::Text(text.as_str().into())],
            Content::Parts(parts) => parts
                .iter()
                .map(|p| Part::Text(p.text.as_str().into()))
                .collect(),
        };
        messages.push(Message {
            role,
            parts: parts.into(),
        });
    }
    let mut request = Request::new(id, Endpoint::Chat, messages);
    request.sampling.max_tokens = body.max_tokens.into();
    Ok(request)
}

/// What the echo plugin streams for `request`: the words of its last user message.
fn tokens(request: &Request) -> Vec<String> {
    let Some(message) = request.messages.iter().rev().find(|m| m.role == Role::User) else {
        return Vec::new();
    };
    let mut words = Vec::new();
    for part in message.parts.iter() {
        if let Part::Text(text) = part {
            words.extend(text.split_whitespace().map(str::to_string));
        }
    }
    words
}

async fn chat(body: Bytes) -> Response {
    let body: ChatBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => return bad_request(format!("invalid JSON body: {e}")),
    };
    if body.stream {
        return bad_request("the baseline answers only non-streaming requests".into());
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let request = match to_request(id, &body) {
        Ok(request) => request,
        Err(message) => return bad_request(message),
    };
    let words = tokens(&request);
    let prompt_tokens = words.len() as u32;
    let limit = request
        .sampling
        .max_tokens
        .into_option()
        .unwrap_or(u32::MAX) as usize;
    let finish_reason = if words.len() > limit {
        "length"
    } else {
        "stop"
    };
    // Built as the echo plugin builds its tokens' text.
    let pieces = stream::iter(words.iter().take(limit).enumerate()).map(|(i, word)| {
        let mut piece = String::with_capacity(1 + word.len());
        if i > 0 {
            piece.push(' ');
        }
        piece.push_str(word);
        piece
    });
    let pieces: Vec<String> = pieces.collect().await;
    let completion_tokens = pieces.len() as u32;
    let text: String = pieces.concat();
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // As switchyard's: a prefix random per process, then the counter.
    let prefix = *ID_PREFIX.get_or_init(|| {
        std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            std::process::id(),
        )
    });
    let id = format!("chatcmpl-{prefix:016x}{id:x}");
    if TYPED.get() == Some(&true) {
        return Json(TypedAnswer {
            id: &id,
            object: "chat.completion",
            created,
            model: &body.model,
            choices: [TypedChoice {
                index: 0,
                message: TypedMessage {
                    role: "assistant",
                    content: &text,
                },
                logprobs: None,
                finish_reason,
            }],
            usage: TypedUsage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
            },
        })
        .into_response();
    }
    Json(json!({
        "id": id, "object": "chat.completion", "created": created,
        "model": body.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": null, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }))
    .into_response()
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8090".into());
    let typed = match std::env::args().nth(2).as_deref() {
        None | Some("json") => false,
        Some("typed") => true,
        Some(other) => panic!("the answer is built as json or typed, not {other:?}"),
    };
    TYPED.set(typed).expect("set once");
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("router-baseline listening on {}", listener.local_addr()?);
    let app = Router::new().route("/v1/chat/completions", post(chat));
    axum::serve(listener, app).await
}
