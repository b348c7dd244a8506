//! End-to-end: a real `switchyard serve` process, real plugin libraries through the real loader,
//! real HTTP over loopback.

mod cli;
mod hardening;
mod http_api;
mod metrics_protocol;
mod phi4mm_hardening;
mod phi4mm_http;
mod reload_failures;
mod reload_triggers;
mod reload_under_load;
mod routing;
