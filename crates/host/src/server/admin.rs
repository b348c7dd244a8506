//! `/admin/reload` and `/admin/status`. Served on the loopback admin listener, and on the main
//! listener only behind a bearer token; [`guard`] protects both.

use super::error::ApiError;
use crate::{instance::Instance, runtime::Runtime};
use axum::{
    extract::{ConnectInfo, Request, State},
    http::{header, HeaderMap, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};
use subtle::ConstantTimeEq;

pub fn routes() -> Router<Arc<Runtime>> {
    Router::new()
        .route("/admin/reload", post(reload))
        .route("/admin/status", get(status))
}

pub async fn reload(State(runtime): State<Arc<Runtime>>) -> Response {
    // On its own task, so that a client that goes away does not cancel the reload half-way:
    // it runs to its end (or its timeouts) whatever happens to this handler.
    tracing::info!("POST /admin/reload: reloading the configuration");
    let reloading = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.reload_from_file().await })
    };
    let Ok(result) = reloading.await else {
        return ApiError::internal("the reload task panicked").into_response();
    };
    match result {
        Ok(report) => (StatusCode::OK, Json(json!({"ok": true, "report": report}))).into_response(),
        Err(e) => {
            let status = match e {
                crate::reload::ReloadError::NoSource => StatusCode::CONFLICT,
                crate::reload::ReloadError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
                crate::reload::ReloadError::Config(_) => StatusCode::BAD_REQUEST,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            };
            let body = json!({"ok": false, "error": e.to_string(),
                              "serving_generation": runtime.current().generation});
            (status, Json(body)).into_response()
        }
    }
}

pub async fn status(State(runtime): State<Arc<Runtime>>) -> Json<Value> {
    let deployment = runtime.current();
    let used: Vec<&str> = deployment
        .plugins
        .iter()
        .map(|p| p.sha256.as_str())
        .collect();
    let mut plugins: Vec<Value> = runtime
        .registry()
        .loaded()
        .iter()
        .map(|p| {
            json!({
                "name": p.manifest.name.as_str(), "version": p.version(), "build_id": p.manifest.build_id.as_str(),
                "api_version": p.manifest.api_version.to_string(), "sha256": p.sha256,
                "path": p.original_path, "in_use": used.contains(&p.sha256.as_str()),
            })
        })
        .collect();
    plugins.sort_by_key(|p| {
        p["name"].as_str().unwrap_or_default().to_string()
            + p["version"].as_str().unwrap_or_default()
    });
    let mut instances: Vec<Value> = deployment.instances().map(describe).collect();
    instances.sort_by_key(|i| i["name"].as_str().unwrap_or_default().to_string());
    let retired: Vec<Value> = runtime.retired_instances().iter().map(describe).collect();
    Json(json!({
        "generation": deployment.generation,
        "config": deployment.config.source(),
        "plugins": plugins,
        "instances": instances,
        "retired_instances": retired,
        "retired_libraries": runtime.retired_libraries(),
        "loaded_libraries": runtime.registry().loaded_count(),
    }))
}

fn describe(instance: &Arc<Instance>) -> Value {
    let stats = instance.stats();
    let details: Value = serde_json::from_str(stats.details_json.as_str()).unwrap_or(Value::Null);
    json!({
        "name": instance.name,
        "plugin": instance.plugin.manifest.name.as_str(),
        "plugin_version": instance.plugin.version(),
        "kind": instance.kind.kind.as_str(),
        "state": instance.state(),
        "in_flight": instance.in_flight(),
        "admissions_released": instance.served(),
        "max_in_flight": instance.max_in_flight,
        "stats": {
            "running": stats.running, "queued": stats.queued, "free_slots": stats.free_slots,
            "adapters": stats.adapters.iter().map(|a| json!({"adapter": a.adapter.as_str(), "rows": a.rows})).collect::<Vec<_>>(),
            "details": details,
        },
    })
}

/// Who may use `/admin/*` on a listener.
pub struct AdminGuard {
    /// sha256 of `Bearer <admin_token>`, when a token is configured.
    token_digest: Option<[u8; 32]>,
    /// Whether a loopback peer that names a loopback `Host` needs no token (the admin
    /// listener; never the main one).
    trust_loopback: bool,
}

/// An `Authorization` value's scheme, with the space that ends it.
const BEARER: &[u8] = b"Bearer ";

/// The header that marks a `POST /admin/*` as not sent by a browser form.
pub const ADMIN_HEADER: &str = "x-switchyard-admin";

impl AdminGuard {
    pub fn new(token: Option<&str>, trust_loopback: bool) -> Self {
        Self {
            token_digest: token.map(|t| digest(&format!("Bearer {t}"))),
            trust_loopback,
        }
    }

    /// Whether `given` (an `Authorization` value) is the token. Both sides are hashed first and
    /// the digests compared in constant time, so neither the token's bytes nor its length can
    /// be learnt from the timing.
    fn token_matches(&self, given: Option<&[u8]>) -> bool {
        match (self.token_digest, given) {
            (Some(expected), Some(given)) => {
                // The scheme's name is case-insensitive (RFC 9110): `bearer x` is `Bearer x`.
                let given = match given.split_at_checked(BEARER.len()) {
                    Some((scheme, token)) if scheme.eq_ignore_ascii_case(BEARER) => {
                        digest_bytes(&[b"Bearer ".as_slice(), token].concat())
                    }
                    _ => digest_bytes(given),
                };
                bool::from(expected.ct_eq(&given))
            }
            _ => false,
        }
    }
}

fn digest(text: &str) -> [u8; 32] {
    digest_bytes(text.as_bytes())
}

fn digest_bytes(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The guard on the admin routes of every listener (`axum::middleware::from_fn_with_state`):
///
/// 1. a cross-site request is refused (403): `Sec-Fetch-Site: cross-site` or `same-site`, or
///    an `Origin` that is not a loopback origin;
/// 2. the bearer token, when one is configured, admits the request;
/// 3. else, on the admin listener only, a loopback peer whose `Host` is a loopback name or
///    address is admitted, and a `POST` must carry `content-type: application/json` or an
///    `x-switchyard-admin` header (415), which no cross-site form can send without a
///    preflight;
/// 4. anything else is 401.
pub async fn guard(State(guard): State<Arc<AdminGuard>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site") {
        let message =
            format!("admin endpoints refuse cross-site requests (Sec-Fetch-Site: {site})");
        return ApiError::forbidden("cross_site_request", message).into_response();
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !is_loopback_origin(origin) {
            let message = format!(
                "admin endpoints refuse requests from origin {}",
                super::error::shown(origin)
            );
            return ApiError::forbidden("cross_site_request", message).into_response();
        }
    }
    let authorization = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    if guard.token_matches(authorization) {
        return next.run(request).await;
    }
    let peer_is_loopback = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback());
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !(guard.trust_loopback && peer_is_loopback) {
        return ApiError::unauthorized().into_response();
    }
    if !is_loopback_host(host) {
        let message = format!(
            "admin endpoints without a token answer a loopback Host only, not {} (DNS \
             rebinding)",
            super::error::shown(host)
        );
        return ApiError::forbidden("foreign_host", message).into_response();
    }
    if request.method() == Method::POST && !is_json(headers) && !headers.contains_key(ADMIN_HEADER)
    {
        let mut error = ApiError::unsupported_media_type("application/json");
        error.message = format!(
            "POST /admin/* needs content-type: application/json or an {ADMIN_HEADER} header"
        );
        return error.into_response();
    }
    next.run(request).await
}

/// Whether the request's `content-type` is `application/json` (parameters allowed).
pub fn is_json(headers: &HeaderMap) -> bool {
    content_type_is(headers, "application/json")
}

/// Whether the `content-type`'s media type is `essence` (case-insensitive, parameters allowed).
pub fn content_type_is(headers: &HeaderMap, essence: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(essence))
}

/// `localhost`, `*.localhost`, or a loopback IP address, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [::1] or [::1]:port
        match rest.split_once(']') {
            Some((ip, _)) => ip,
            None => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            _ => host,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `http(s)://<loopback host>[:port]`.
fn is_loopback_origin(origin: &str) -> bool {
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|host| !host.contains('/') && is_loopback_host(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_and_origins() {
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:9",
            "[::1]:80",
            "127.9.9.9",
            "a.localhost",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.com",
            "evil.com:80",
            "10.0.0.1:80",
            "localhost.evil.com",
            "",
            "[::2]",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
        assert!(is_loopback_origin("http://127.0.0.1:3000"));
        assert!(!is_loopback_origin("http://evil.com"));
        assert!(!is_loopback_origin("null"));
    }

    #[test]
    fn the_token_is_compared_by_digest() {
        let guard = AdminGuard::new(Some("s3cret-token-0123456789"), false);
        assert!(guard.token_matches(Some(b"Bearer s3cret-token-0123456789")));
        assert!(!guard.token_matches(Some(b"Bearer s3cret-token-012345678")));
        assert!(!guard.token_matches(Some(b"Bearer s3cret-token-01234567890")));
        assert!(!guard.token_matches(None));
        assert!(!AdminGuard::new(None, true).token_matches(Some(b"Bearer ")));
        assert!(guard.token_matches(Some(b"bearer s3cret-token-0123456789")));
        assert!(guard.token_matches(Some(b"BEARER s3cret-token-0123456789")));
        assert!(!guard.token_matches(Some(b"Basic s3cret-token-0123456789")));
        assert!(!guard.token_matches(Some(b"bearer S3cret-token-0123456789")));
    }
}
