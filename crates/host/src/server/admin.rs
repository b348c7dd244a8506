//! `/admin/reload` and `/admin/status`. Served on the loopback admin listener, and on the main
//! listener only behind a bearer token (see [`require_token`]).

use super::error::ApiError;
use crate::{instance::Instance, runtime::Runtime};
use axum::{
    extract::{Request, State},
    http::{header, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde_json::{json, Value};
use std::sync::Arc;

pub fn routes() -> Router<Arc<Runtime>> {
    Router::new()
        .route("/admin/reload", post(reload))
        .route("/admin/status", get(status))
}

/// The main listener's guard on the admin routes (`axum::middleware::from_fn_with_state`).
pub async fn require_token(
    State(token): State<Arc<String>>,
    request: Request,
    next: Next,
) -> Response {
    let expected = format!("Bearer {token}");
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // Compare without early exit so the token cannot be guessed byte by byte from timing.
    let ok = given.is_some_and(|g| {
        g.len() == expected.len()
            && g.bytes()
                .zip(expected.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if ok {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

pub async fn reload(State(runtime): State<Arc<Runtime>>) -> Response {
    match runtime.reload_from_file().await {
        Ok(report) => (StatusCode::OK, Json(json!({"ok": true, "report": report}))).into_response(),
        Err(e) => {
            let status = match e {
                crate::reload::ReloadError::NoSource => StatusCode::CONFLICT,
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
