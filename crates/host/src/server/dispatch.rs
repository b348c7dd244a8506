//! From a parsed request to an admitted one: resolve the route, try the chosen backend, then the
//! fallbacks. A request that meets only draining instances (a reload swapped the table between
//! resolve and submit) is resolved again against the new table, so reloads fail no request.

use super::{
    error::{ApiError, PartNames},
    event_stream::EventStream,
};
use crate::{
    instance::{Instance, Refusal, Submission},
    router::RouteError,
    runtime::Runtime,
};
use abi_stable::std_types::ROption;
use axum::http::HeaderMap;
use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

const RESOLVE_ATTEMPTS: usize = 3;

/// A request no instance admitted: the client's error, and the instance whose own refusal
/// ended the dispatch (its plugin refused the request, or it is over that instance's cap),
/// which the response and the metrics then name. A refusal over all the candidates (all full,
/// all draining) or before any (no such model) names none.
pub struct Rejection {
    pub error: ApiError,
    pub by: Option<Arc<Instance>>,
}

impl From<ApiError> for Rejection {
    fn from(error: ApiError) -> Self {
        Self { error, by: None }
    }
}

/// Call it through [`Runtime::parse_body`] (or [`Runtime::off_the_runtime`]), never directly on
/// an async thread for a large request: a plugin's `submit` may do CPU work bounded only by the
/// request caps (Phi4MM tokenizes the prompt and reads the media headers to charge its queue).
pub fn dispatch(
    runtime: &Runtime,
    model: &str,
    headers: &HeaderMap,
    request: impl Into<Submission>,
    started: Instant,
) -> Result<EventStream, Rejection> {
    let mut submission = request.into();
    // One snapshot of the deployment per resolve: each read of it touches a reference count
    // that every request shares.
    let mut deployment = runtime.current();
    let server = deployment.config.server();
    let retry_after = server.retry_after_secs;
    if runtime.is_terminating() {
        return Err(ApiError {
            retry_after: Some(retry_after),
            ..ApiError::unavailable(
                "the server is shutting down (SIGTERM); send the request to another replica",
            )
        }
        .into());
    }
    // The wall-clock limit from the request's arrival: the plugin gets it as the deadline, and
    // the event stream ends the request there if the plugin does not.
    let timeout_secs = server.request_timeout_secs;
    let deadline = started + Duration::from_secs_f64(timeout_secs);
    let unix_deadline = SystemTime::now() + deadline.saturating_duration_since(Instant::now());
    // Rounded up: the plugin's deadline must not come before the host's, whose expiry is the
    // request's 504 (a plugin that ended it a millisecond early made it a 408 "cancelled").
    let unix_ms = unix_deadline
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().div_ceil(1_000_000) as u64);
    submission.request.deadline_unix_ms = ROption::RSome(unix_ms);
    let modality = submission.request.modality();
    for attempt in 0..RESOLVE_ATTEMPTS {
        if attempt > 0 {
            let next = runtime.current();
            if next.generation == deployment.generation {
                break;
            }
            deployment = next;
        }
        let candidates =
            deployment
                .table
                .resolve(model, modality, headers)
                .map_err(|e| match e {
                    RouteError::UnknownModel(_) => ApiError::not_found_model(e.to_string()),
                    RouteError::NoMatch { .. } => ApiError::invalid_param("model", e.to_string()),
                })?;
        let (mut full, mut unavailable, mut unsupported) = (None, None, None);
        for instance in candidates.iter() {
            let metrics = &runtime.metrics;
            match EventStream::open(instance, submission.clone(), metrics, model, started) {
                Ok(events) => return Ok(events.with_deadline(deadline, timeout_secs)),
                Err(Refusal::Full(m)) => full = Some(m),
                Err(Refusal::Unavailable(m)) => unavailable = Some(m),
                Err(Refusal::Unsupported { message, part }) => {
                    let param = part.and_then(|place| PartNames::of(&submission).name(place));
                    unsupported = Some((message, param));
                }
                Err(Refusal::Failed(e)) => {
                    return Err(Rejection {
                        error: ApiError::from_plugin(&e, retry_after, PartNames::of(&submission)),
                        by: Some(instance.clone()),
                    })
                }
                Err(Refusal::OverCap(cap)) => {
                    return Err(Rejection {
                        error: ApiError::invalid_param(cap.param, cap.message),
                        by: Some(instance.clone()),
                    })
                }
            }
        }
        if let Some(m) = full {
            return Err(ApiError::overloaded(m, retry_after).into());
        }
        if unavailable.is_none() {
            if let Some((message, param)) = unsupported {
                let error = ApiError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "unsupported",
                    message,
                );
                return Err(ApiError { param, ..error }.into());
            }
        }
        // Only draining/stopped instances: a reload may have just swapped the table.
        if let Some(m) = unavailable {
            if runtime.current().generation == deployment.generation {
                return Err(ApiError::unavailable(m).into());
            }
        }
    }
    Err(ApiError::unavailable(format!(
        "model {} has no available instance",
        super::error::shown(model)
    ))
    .into())
}
