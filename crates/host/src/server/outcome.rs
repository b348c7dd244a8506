//! What every API response says about its request, written down in one place. A handler
//! returns [`Served`] (an instance took the request) or [`Refused`] (none did); the [`record`]
//! layer on each API route turns the first into the `x-switchyard-instance` and
//! `x-switchyard-plugin` headers, and the second into the refusal metrics of that route's
//! endpoint. (A request that an instance took is recorded by its event stream instead, for it
//! ends when its body does.)

use super::error::ApiError;
use crate::{instance::Instance, metrics::Metrics};
use axum::{
    extract::State,
    http::{HeaderName, HeaderValue},
    response::{IntoResponse, Response},
};
use std::sync::Arc;

/// Names the instance that served a response.
pub const SERVED_BY_INSTANCE: &str = "x-switchyard-instance";
/// Names the plugin version (`name@version`) that served a response.
pub const SERVED_BY_PLUGIN: &str = "x-switchyard-plugin";

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
}

impl Refused {
    pub fn new(model: &str, error: ApiError) -> Self {
        Self {
            model: model.into(),
            error,
        }
    }

    /// Refused before the model was known.
    pub fn unread(error: ApiError) -> Self {
        Self::new("", error)
    }
}

/// How a handler's response reaches [`record`]: as a response extension, which `record` removes.
#[derive(Clone)]
enum Outcome {
    Served { instance: String, plugin: String },
    Refused { model: String, code: &'static str },
}

impl IntoResponse for Served {
    fn into_response(self) -> Response {
        let mut response = self.response;
        response.extensions_mut().insert(Outcome::Served {
            instance: self.instance.name.clone(),
            plugin: self.instance.plugin_label(),
        });
        response
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let code = self.error.code;
        let mut response = self.error.into_response();
        response.extensions_mut().insert(Outcome::Refused {
            model: self.model,
            code,
        });
        response
    }
}

/// The layer function (`axum::middleware::map_response_with_state`), with the route's metrics
/// and endpoint name.
pub async fn record(
    State((metrics, endpoint)): State<(Metrics, &'static str)>,
    mut response: Response,
) -> Response {
    match response.extensions_mut().remove::<Outcome>() {
        Some(Outcome::Served { instance, plugin }) => {
            let headers = response.headers_mut();
            for (name, value) in [(SERVED_BY_INSTANCE, instance), (SERVED_BY_PLUGIN, plugin)] {
                if let Ok(value) = HeaderValue::try_from(value) {
                    headers.insert(HeaderName::from_static(name), value);
                }
            }
        }
        Some(Outcome::Refused { model, code }) => {
            metrics.request_refused(&model, endpoint, response.status().as_u16(), code);
        }
        None => {}
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Snapshot;

    #[tokio::test]
    async fn a_refusal_is_counted_once_under_the_routes_endpoint() {
        let metrics = Metrics::new();
        let refused = Refused::new("chat", ApiError::not_found_model("no such model"));
        let state = State((metrics.clone(), "transcription"));
        let response = record(state, refused.into_response()).await;
        assert_eq!(response.status().as_u16(), 404);
        assert!(response.extensions().get::<Outcome>().is_none());
        assert!(response.headers().get(SERVED_BY_INSTANCE).is_none());

        // A response that says nothing (health, an extractor's own rejection) is left alone.
        let plain = record(State((metrics.clone(), "chat")), "ok".into_response()).await;
        assert_eq!(plain.status().as_u16(), 200);

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
