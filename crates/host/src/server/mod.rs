//! The HTTP server (axum on tokio): the OpenAI-compatible API, health, metrics and admin.

mod admin;
mod chat;
mod dispatch;
pub mod error;
pub mod event_stream;
mod health;
mod logprobs;
mod openai;
pub mod outcome;
mod record;
mod transcriptions;

use crate::{instance::endpoint_name, metrics::Metrics, reload, runtime::Runtime};
use axum::{
    extract::DefaultBodyLimit,
    middleware,
    routing::{get, post},
    Router,
};
use std::{net::SocketAddr, sync::Arc, time::Duration};
use switchyard_plugin_api::Endpoint;

fn api_routes(metrics: &Metrics) -> Router<Arc<Runtime>> {
    // Each API route writes down its responses' outcomes (`x-switchyard-*` headers, refusals)
    // under its endpoint's name.
    let outcomes = |endpoint: Endpoint| {
        middleware::map_response_with_state(
            (metrics.clone(), endpoint_name(endpoint)),
            outcome::record,
        )
    };
    Router::new()
        .route(
            "/v1/chat/completions",
            post(chat::chat_completions).layer(outcomes(Endpoint::Chat)),
        )
        .route(
            "/v1/audio/transcriptions",
            post(transcriptions::transcriptions).layer(outcomes(Endpoint::Transcription)),
        )
        .route("/v1/models", get(health::models))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
}

/// The main listener's router: the API, plus admin behind a bearer token when one is configured.
pub fn main_router(runtime: Arc<Runtime>) -> Router {
    let server = runtime.current().config.server().clone();
    let mut router = api_routes(&runtime.metrics);
    if let Some(token) = server.admin_token.clone() {
        router = router.merge(admin::routes().layer(middleware::from_fn_with_state(
            Arc::new(token),
            admin::require_token,
        )));
    }
    router
        .layer(DefaultBodyLimit::max(server.max_body_bytes))
        .with_state(runtime)
}

/// The admin listener's router (loopback only; no token needed).
pub fn admin_router(runtime: Arc<Runtime>) -> Router {
    admin::routes()
        .route("/health", get(health::health))
        .with_state(runtime)
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
pub async fn serve(
    runtime: Arc<Runtime>,
    listen: SocketAddr,
    admin: Option<SocketAddr>,
) -> Result<(), ServeError> {
    let main = tokio::net::TcpListener::bind(listen).await?;
    let main_addr = main.local_addr()?;
    tracing::info!(%main_addr, "listening");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let app = main_router(runtime.clone());
    tasks.spawn(serve_until_stopped(main, app, stop_rx.clone()));
    if let Some(addr) = admin {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(admin_addr = %listener.local_addr()?, "admin listening");
        let app = admin_router(runtime.clone());
        tasks.spawn(serve_until_stopped(listener, app, stop_rx.clone()));
    }
    reload::triggers::spawn(&runtime)?;

    wait_for_termination().await;
    tracing::info!("shutting down: draining instances");
    let deadline = Duration::from_secs_f64(runtime.current().config.server().drain_timeout_secs);
    let _ = stop_tx.send(true);
    runtime.shutdown(deadline).await;
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Serves `app` on `listener` until `stop` turns true, then finishes the open connections.
async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    app: Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
}

async fn wait_for_termination() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
