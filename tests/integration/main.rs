//! End-to-end: a real `switchyard serve` process, real plugin libraries through the real loader,
//! real HTTP over loopback.

mod cli;
mod completions;
mod deploy_manifests;
mod hardening;
mod http_api;
mod metrics_protocol;
mod phi4mm_hardening;
mod phi4mm_http;
mod reload_failures;
mod reload_triggers;
mod reload_under_load;
mod routing;
mod termination;

/// The IREE artifact cache of the whole test run, under cargo's target tmp dir: the plugin's own
/// IREE tests fill the same directory (`crates/phi4mm/tests/phi4mm/iree_support.rs`), so a
/// module of one shape is compiled once per run.
fn shared_iree_cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("iree-cache")
}
