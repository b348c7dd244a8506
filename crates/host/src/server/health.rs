//! `/health` (the process is up), `/ready` (every configured instance is ready and the process
//! is not shutting down), `/metrics`,
//! and `/v1/models`.

use super::error::ApiError;
use crate::{instance::InstanceState, runtime::Runtime};
use axum::{
    extract::{rejection::PathRejection, Path, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;
use std::sync::Arc;

pub async fn health() -> &'static str {
    "ok"
}

pub async fn ready(State(runtime): State<Arc<Runtime>>) -> Response {
    let deployment = runtime.current();
    let states: serde_json::Map<String, serde_json::Value> = deployment
        .instances()
        .map(|i| {
            (
                i.name.clone(),
                json!({"state": i.state(), "plugin": i.plugin_label()}),
            )
        })
        .collect();
    let configured = deployment.config.models().len();
    // A process that is shutting down takes no new traffic, whatever its instances say.
    let all_ready = !runtime.is_terminating()
        && configured > 0
        && states.len() == configured
        && deployment
            .instances()
            .all(|i| i.state() == InstanceState::Ready);
    let status = if all_ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(
            json!({"ready": all_ready, "terminating": runtime.is_terminating(),
                    "generation": deployment.generation, "instances": states}),
        ),
    )
        .into_response()
}

pub async fn metrics(State(runtime): State<Arc<Runtime>>) -> Response {
    let text = runtime.metrics.render(&runtime.metrics_snapshot());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn models(State(runtime): State<Arc<Runtime>>) -> Json<serde_json::Value> {
    let deployment = runtime.current();
    let data: Vec<_> = deployment
        .config
        .public_model_names()
        .iter()
        .map(|id| model_object(id, deployment.created))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{model}`: one entry of the list (the SDKs' `models.retrieve`).
pub async fn model(
    State(runtime): State<Arc<Runtime>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    // A name that is no UTF-8 (`%FF`) is answered in the API's error shape, not axum's text.
    let Path(id) = id.map_err(|rejection| {
        ApiError::new(
            rejection.status(),
            "invalid_request_error",
            "invalid_model",
            rejection.body_text(),
        )
    })?;
    let deployment = runtime.current();
    if !deployment.config.public_model_names().contains(&id) {
        return Err(ApiError::not_found_model(format!(
            "The model {} does not exist",
            super::error::shown(&id)
        )));
    }
    Ok(Json(model_object(&id, deployment.created)))
}

/// A model as OpenAI lists it; `created` is when the configuration that serves it was loaded.
fn model_object(id: &str, created: u64) -> serde_json::Value {
    json!({"id": id, "object": "model", "created": created, "owned_by": "switchyard"})
}
