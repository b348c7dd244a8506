//! What every API response says about its request, written down in one place. A handler
//! ends in [`Served`] (an instance took the request), which carries the `x-switchyard-instance`
//! and `x-switchyard-plugin` headers, or [`Refused`] (none did), which [`respond`] counts in the
//! refusal metrics of the handler's endpoint. (A request that an instance took is recorded by
//! its event stream instead, for it ends when its body does.) This is a function the handlers
//! call rather than a layer on their routes: a route layer boxed and cloned a service per
//! request.

use super::{dispatch::Rejection, error::ApiError};
use crate::{instance::Instance, metrics::Metrics};
use axum::{
    http::HeaderName,
    response::{IntoResponse, Response},
};
use std::{fmt::Display, sync::Arc};

// Header names as constants: checked once, at compile time, not on every response.
/// Names the instance that served a response.
pub const SERVED_BY_INSTANCE: HeaderName = HeaderName::from_static("x-switchyard-instance");
/// Names the plugin version (`name@version`) that served a response.
pub const SERVED_BY_PLUGIN: HeaderName = HeaderName::from_static("x-switchyard-plugin");

/// A response from the instance that took the request, success or not.
pub struct Served {
    instance: Arc<Instance>,
    response: Response,
}

impl Served {
    pub fn new(instance: Arc<Instance>, response: impl IntoResponse) -> Self {
        Self {
            instance,
            response: response.into_response(),
        }
    }
}

/// A request refused before any instance took it.
pub struct Refused {
    /// The requested model, or empty when the request was not read far enough to know it.
    model: String,
    error: ApiError,
    /// The instance whose own refusal it was ([`Rejection::by`]): the response's headers and
    /// the refusal's metrics name it.
    by: Option<Arc<Instance>>,
}

impl Refused {
    pub fn new(model: &str, error: ApiError) -> Self {
        Self {
            model: model.into(),
            error,
            by: None,
        }
    }

    /// What the dispatch refused.
    pub fn rejected(model: &str, rejection: Rejection) -> Self {
        Self {
            by: rejection.by,
            ..Self::new(model, rejection.error)
        }
    }

    /// Refused before the model was known.
    pub fn unread(error: ApiError) -> Self {
        Self::new("", error)
    }
}

impl IntoResponse for Served {
    fn into_response(self) -> Response {
        let mut response = self.response;
        name_instance(&mut response, &self.instance);
        response
    }
}

/// Puts the headers that name `instance` and its plugin version on `response`.
fn name_instance(response: &mut Response, instance: &Instance) {
    let headers = response.headers_mut();
    let names = [SERVED_BY_INSTANCE, SERVED_BY_PLUGIN];
    for (name, value) in names.into_iter().zip(instance.served_by_headers()) {
        if let Some(value) = value {
            headers.insert(name, value.clone());
        }
    }
}

/// Logs a request that `instance`'s plugin failed with a 500 (a panic, an internal error, a
/// request left without its end): the client and the metrics see it, and so must the log an
/// operator searches, naming the instance. Refusals of bad input and timeouts are not faults.
pub fn log_plugin_fault(instance: &Instance, status: u16, code: &str, error: &dyn Display) {
    if status == 500 {
        tracing::warn!(
            instance = %instance.name,
            plugin = %instance.plugin_label(),
            code,
            "a request failed in its plugin: {error}"
        );
    }
}

/// The response to a request to `endpoint` (its name in the metrics), with a refusal counted.
pub fn respond(
    metrics: &Metrics,
    endpoint: &'static str,
    outcome: Result<Served, Refused>,
) -> Response {
    match outcome {
        Ok(served) => served.into_response(),
        Err(Refused { model, error, by }) => {
            let code = error.code;
            if let Some(instance) = &by {
                log_plugin_fault(instance, error.status.as_u16(), code, &error.message);
            }
            let mut response = error.into_response();
            let status = response.status().as_u16();
            let series = by.map(|instance| {
                name_instance(&mut response, &instance);
                instance.request_series(metrics)
            });
            let served_by = series.as_ref().map(|s| &s.served_by);
            metrics.request_refused(served_by, &model, endpoint, status, code);
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Snapshot;

    #[test]
    fn a_refusal_is_counted_once_under_the_handlers_endpoint() {
        let metrics = Metrics::new();
        let refused = Refused::new("chat", ApiError::not_found_model("no such model"));
        let response = respond(&metrics, "transcription", Err(refused));
        assert_eq!(response.status().as_u16(), 404);
        assert!(response.headers().get(SERVED_BY_INSTANCE).is_none());

        let text = metrics.render(&Snapshot::default());
        let line = r#"switchyard_requests_total{instance="",plugin_version="",model="chat",endpoint="transcription",status="404"} 1"#;
        assert!(text.contains(line), "{text}");
        let line = r#"switchyard_request_errors_total{instance="",plugin_version="",kind="model_not_found"} 1"#;
        assert!(text.contains(line), "{text}");
        assert_eq!(
            text.matches("switchyard_requests_total{").count(),
            1,
            "{text}"
        );
    }
}
