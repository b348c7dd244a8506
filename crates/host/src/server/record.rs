//! Per-request bookkeeping for metrics: one record per admitted request, written when it ends,
//! however it ends (finished, failed, or dropped because the client went away).

use crate::{instance::Instance, metrics::Labels, runtime::Runtime};
use std::{sync::Arc, time::Instant};

pub struct RequestRecord {
    runtime: Arc<Runtime>,
    instance: Arc<Instance>,
    model: String,
    endpoint: &'static str,
    started: Instant,
    first_token: Option<Instant>,
    /// HTTP-like status to record; 499 (client closed) unless set otherwise.
    status: u16,
    error_kind: Option<String>,
}

impl RequestRecord {
    pub fn new(
        runtime: Arc<Runtime>,
        instance: Arc<Instance>,
        model: &str,
        endpoint: &'static str,
        started: Instant,
    ) -> Self {
        Self {
            runtime,
            instance,
            model: model.into(),
            endpoint,
            started,
            first_token: None,
            status: 499,
            error_kind: None,
        }
    }

    pub fn token(&mut self) {
        if self.first_token.is_none() {
            self.first_token = Some(Instant::now());
            let labels = self.instance_labels();
            self.runtime
                .metrics
                .time_to_first_token
                .get_or_create(&labels)
                .observe(self.started.elapsed().as_secs_f64());
        }
    }

    pub fn finish(&mut self, status: u16) {
        self.status = status;
    }

    pub fn fail(&mut self, status: u16, kind: &str) {
        self.status = status;
        self.error_kind = Some(kind.into());
    }

    fn instance_labels(&self) -> Labels {
        vec![
            ("instance".into(), self.instance.name.clone()),
            (
                "plugin_version".into(),
                self.instance.plugin.version().to_string(),
            ),
        ]
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        let metrics = &self.runtime.metrics;
        let labels = self.instance_labels();
        metrics
            .latency
            .get_or_create(&labels)
            .observe(self.started.elapsed().as_secs_f64());
        let mut request_labels = labels.clone();
        request_labels.push(("model".into(), self.model.clone()));
        request_labels.push(("endpoint".into(), self.endpoint.into()));
        request_labels.push(("status".into(), self.status.to_string()));
        metrics.requests.get_or_create(&request_labels).inc();
        if self.status == 499 && self.error_kind.is_none() {
            self.error_kind = Some("client_closed".into());
        }
        if let Some(kind) = &self.error_kind {
            let mut l = labels;
            l.push(("kind".into(), kind.clone()));
            metrics.errors.get_or_create(&l).inc();
        }
    }
}

/// Records a request refused before admission (no instance was involved).
pub fn record_refusal(
    runtime: &Runtime,
    model: &str,
    endpoint: &'static str,
    status: u16,
    code: &str,
) {
    let labels: Labels = vec![
        ("instance".into(), String::new()),
        ("plugin_version".into(), String::new()),
        ("model".into(), model.into()),
        ("endpoint".into(), endpoint.into()),
        ("status".into(), status.to_string()),
    ];
    runtime.metrics.requests.get_or_create(&labels).inc();
    let errors: Labels = vec![
        ("instance".into(), String::new()),
        ("plugin_version".into(), String::new()),
        ("kind".into(), code.into()),
    ];
    runtime.metrics.errors.get_or_create(&errors).inc();
}
