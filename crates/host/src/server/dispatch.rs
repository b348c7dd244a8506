//! From a parsed request to an admitted one: resolve the route, try the chosen backend, then the
//! fallbacks. A request that meets only draining instances (a reload swapped the table between
//! resolve and submit) is resolved again against the new table, so reloads fail no request.

use super::{error::ApiError, event_stream::EventStream};
use crate::{instance::Refusal, router::RouteError, runtime::Runtime};
use axum::http::HeaderMap;
use std::time::Instant;
use switchyard_plugin_api::Request;

const RESOLVE_ATTEMPTS: usize = 3;

pub fn dispatch(
    runtime: &Runtime,
    model: &str,
    headers: &HeaderMap,
    request: Request,
    started: Instant,
) -> Result<EventStream, ApiError> {
    let retry_after = runtime.current().config.server().retry_after_secs;
    let modality = request.modality();
    let mut last_generation = None;
    for _ in 0..RESOLVE_ATTEMPTS {
        let deployment = runtime.current();
        if last_generation == Some(deployment.generation) {
            break;
        }
        last_generation = Some(deployment.generation);
        let candidates =
            deployment
                .table
                .resolve(model, modality, headers)
                .map_err(|e| match e {
                    RouteError::UnknownModel(_) => ApiError::not_found_model(e.to_string()),
                    RouteError::NoMatch { .. } => ApiError::invalid_param("model", e.to_string()),
                })?;
        let (mut full, mut unavailable, mut unsupported) = (None, None, None);
        for instance in candidates {
            let metrics = &runtime.metrics;
            match EventStream::open(&instance, request.clone(), metrics, model, started) {
                Ok(events) => return Ok(events),
                Err(Refusal::Full(m)) => full = Some(m),
                Err(Refusal::Unavailable(m)) => unavailable = Some(m),
                Err(Refusal::Unsupported(m)) => unsupported = Some(m),
                Err(Refusal::Failed(e)) => return Err(ApiError::from_plugin(&e, retry_after)),
            }
        }
        if let Some(m) = full {
            return Err(ApiError::overloaded(m, retry_after));
        }
        if unavailable.is_none() {
            if let Some(m) = unsupported {
                return Err(ApiError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "unsupported",
                    m,
                ));
            }
        }
        // Only draining/stopped instances: a reload may have just swapped the table.
        if let Some(m) = unavailable {
            if runtime.current().generation == deployment.generation {
                return Err(ApiError::unavailable(m));
            }
        }
    }
    Err(ApiError::unavailable(format!(
        "model `{model}` has no available instance"
    )))
}
