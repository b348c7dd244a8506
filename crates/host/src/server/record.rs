//! Per-request bookkeeping for metrics: one record per admitted request, written when it is
//! dropped, however the request ends (finished, failed, or dropped because the client went away).

use crate::metrics::{InstanceSeries, Metrics, RequestEnd};
use std::{sync::Arc, time::Instant};

/// The HTTP-like status of a request whose client went away before it ended.
const CLIENT_CLOSED: u16 = 499;

pub struct RequestRecord {
    metrics: Metrics,
    /// The serving instance's series.
    series: Arc<InstanceSeries>,
    model: String,
    endpoint: &'static str,
    started: Instant,
    /// When the last token came, if one did.
    last_token: Option<Instant>,
    /// The prompt's tokens were counted (the first `Started`; a plugin that sends a second one
    /// breaks the ABI's order, and its prompt is not counted twice).
    prompt_counted: bool,
    /// HTTP-like status to record; [`CLIENT_CLOSED`] unless set otherwise.
    status: u16,
    error_kind: Option<&'static str>,
}

impl RequestRecord {
    pub fn new(
        metrics: Metrics,
        series: Arc<InstanceSeries>,
        model: &str,
        endpoint: &'static str,
        started: Instant,
    ) -> Self {
        Self {
            metrics,
            series,
            model: model.into(),
            endpoint,
            started,
            last_token: None,
            prompt_counted: false,
            status: CLIENT_CLOSED,
            error_kind: None,
        }
    }

    /// The plugin took the prompt in (`Event::Started`).
    pub fn started(&mut self, prompt_tokens: u32) {
        if !std::mem::replace(&mut self.prompt_counted, true) {
            self.series.vllm.prompt(prompt_tokens);
        }
    }

    /// A token arrived at `now`.
    pub fn token(&mut self, now: Instant) {
        match self.last_token.replace(now) {
            None => {
                let after = now - self.started;
                self.series.first_token(after);
                self.series.vllm.token(true, after);
            }
            Some(previous) => self.series.vllm.token(false, now - previous),
        }
    }

    pub fn finish(&mut self, status: u16) {
        self.status = status;
    }

    pub fn fail(&mut self, status: u16, kind: &'static str) {
        self.status = status;
        self.error_kind = Some(kind);
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        let error = match self.error_kind {
            None if self.status == CLIENT_CLOSED => Some("client_closed"),
            kind => kind,
        };
        let duration = self.started.elapsed();
        self.series.vllm.ended(duration);
        self.metrics.request_ended(&RequestEnd {
            series: &self.series,
            model: &self.model,
            endpoint: self.endpoint,
            status: self.status,
            error,
            duration,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{
        tests::{served, served_by},
        Snapshot,
    };

    #[test]
    fn a_second_started_does_not_count_the_prompt_again() {
        let metrics = Metrics::new();
        let series = Arc::new(metrics.instance_series(Arc::new(served()), served_by()));
        let mut record =
            RequestRecord::new(metrics.clone(), series, "chat", "chat", Instant::now());
        record.started(7);
        record.started(7);
        record.finish(200);
        drop(record);
        let text = metrics.render(&Snapshot::default());
        let line = r#"vllm:prompt_tokens_total{model_name="chat",instance="a"} 7"#;
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}
