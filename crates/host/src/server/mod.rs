//! The HTTP server (axum on tokio): the OpenAI-compatible API, health, metrics and admin.

mod admin;
mod chat;
mod completions;
mod dispatch;
pub mod error;
pub mod event_stream;
mod generation;
mod health;
mod json_values;
mod listener;
use listener::Peer;
mod logprobs;
mod openai;
pub mod outcome;
mod record;
mod transcriptions;

pub use chat::chat_request_from_json;

use crate::{reload, runtime::Runtime};
use axum::{
    middleware,
    routing::{get, post},
    Router,
};
use std::{net::SocketAddr, sync::Arc, time::Duration};

fn api_routes() -> Router<Arc<Runtime>> {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route(
            "/v1/audio/transcriptions",
            post(transcriptions::transcriptions),
        )
        .route("/v1/models", get(health::models))
        // A wildcard: model names may hold slashes (`microsoft/Phi-4-multimodal-instruct`),
        // which clients do not escape.
        .route("/v1/models/{*model}", get(health::model))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
}

/// The main listener's router: the API, plus admin behind a bearer token when one is configured.
pub fn main_router(runtime: Arc<Runtime>) -> Router {
    let server = runtime.current().config.server().clone();
    let mut router = api_routes();
    if let Some(token) = server.admin_token.as_deref() {
        let guard = Arc::new(admin::AdminGuard::new(Some(token), false));
        router = router
            .merge(admin::routes().layer(middleware::from_fn_with_state(guard, admin::guard)));
    }
    with_json_fallbacks(router).with_state(runtime)
}

/// Unknown paths and methods answered in the API's error shape, not with an empty body. After
/// the routes: the method fallback applies to those registered before it.
fn with_json_fallbacks(router: Router<Arc<Runtime>>) -> Router<Arc<Runtime>> {
    router
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(no_such_endpoint)
}

/// A known path with another method; axum adds the `Allow` header.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> error::ApiError {
    let message = format!(
        "{method} is not allowed on {} (see the Allow header)",
        path_of(&uri)
    );
    error::ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        message,
    )
}

/// An unknown path, answered in the API's error shape rather than with an empty 404.
async fn no_such_endpoint(method: axum::http::Method, uri: axum::http::Uri) -> error::ApiError {
    let message = format!("no endpoint {method} {} (see docs/api.md)", path_of(&uri));
    error::ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        message,
    )
}

/// The request's path as an error names it: the client's text, quoted and cut short like all
/// client text an error repeats ([`error::shown`]).
fn path_of(uri: &axum::http::Uri) -> String {
    error::shown(uri.path())
}

/// The admin listener's router (a loopback address): the token, or a loopback peer naming a
/// loopback `Host` (see `admin::guard`).
pub fn admin_router(runtime: Arc<Runtime>) -> Router {
    let server = runtime.current().config.server().clone();
    let guard = Arc::new(admin::AdminGuard::new(server.admin_token.as_deref(), true));
    let router = admin::routes()
        .layer(middleware::from_fn_with_state(guard, admin::guard))
        .route("/health", get(health::health));
    with_json_fallbacks(router).with_state(runtime)
}

/// Why serving stopped with an error. The messages are those of the underlying errors.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding or serving a listener.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Watching the config file (`server.watch_config`).
    #[error(transparent)]
    Watch(#[from] notify::Error),
}

/// Serves until SIGINT/SIGTERM, with the reload triggers running (see `crate::reload::triggers`).
/// Then it terminates gracefully, for rollouts: `/ready` answers 503 at once and new requests
/// get 503 while the listeners keep answering, the requests in flight finish (at most until
/// `drain_timeout_secs`), and then the listeners close their connections by the same deadline.
/// `hup` is SIGHUP's stream, caught before the first load (`reload::triggers::catch_sighup`).
pub async fn serve(
    runtime: Arc<Runtime>,
    listen: SocketAddr,
    admin: Option<SocketAddr>,
    hup: Option<tokio::signal::unix::Signal>,
) -> Result<(), ServeError> {
    // The triggers come first: once the listener answers `/ready`, a client may edit the config
    // file or send SIGHUP, and neither may be lost.
    reload::triggers::spawn(&runtime, hup)?;
    let main = tokio::net::TcpListener::bind(listen).await?;
    let main_addr = main.local_addr()?;
    tracing::info!(%main_addr, "listening");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None);
    let mut tasks = tokio::task::JoinSet::new();
    // The listeners' limits are read once, at start (like the addresses).
    let server = runtime.current().config.server().clone();
    let limits = listener::HttpLimits::of(&server);
    let app = main_router(runtime.clone());
    tasks.spawn(listener::serve(
        main,
        app,
        limits.clone(),
        Peer::Unused,
        stop_rx.clone(),
    ));
    if let Some(addr) = admin {
        let admin = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(admin_addr = %admin.local_addr()?, "admin listening");
        let app = admin_router(runtime.clone());
        // The admin guard trusts a loopback peer there.
        tasks.spawn(listener::serve(
            admin,
            app,
            limits,
            Peer::Extension,
            stop_rx.clone(),
        ));
    }

    let mut interrupt = wait_for_termination().await;
    // A person at a terminal presses Ctrl-C again to stop at once, and waits for nothing: a
    // drain is for the clients. (A supervisor's second SIGTERM changes nothing; its SIGKILL
    // comes at the end of its own grace period.)
    let forced = runtime.clone();
    tokio::spawn(async move {
        interrupt.recv().await;
        tracing::warn!("a second SIGINT: exiting now with 130, without waiting for the drain");
        forced.remove_shadow_copies();
        // `_exit`, not `exit`: the plugins' threads are still generating, and `exit` would run
        // the loaded libraries' static destructors (IREE's, LLVM's) under them.
        // SAFETY: `_exit` ends the process at once; nothing after it runs.
        unsafe { libc::_exit(130) };
    });
    let drain = Duration::from_secs_f64(runtime.current().config.server().drain_timeout_secs);
    let deadline = tokio::time::Instant::now() + drain;
    tracing::info!(
        drain_timeout_secs = drain.as_secs_f64(),
        "shutting down: draining instances"
    );
    runtime.shutdown(drain).await;
    // Every request has ended (or was cut at the deadline); what is left is writing out the
    // last bytes and closing idle connections.
    let _ = stop_tx.send(Some(deadline));
    while tasks.join_next().await.is_some() {}
    tracing::info!("shut down");
    Ok(())
}

/// Waits for SIGTERM or SIGINT; returns SIGINT's stream, which stays caught for the drain.
async fn wait_for_termination() -> tokio::signal::unix::Signal {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = term.recv() => {}
    }
    interrupt
}
