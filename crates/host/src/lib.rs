//! Switchyard: an inference router that many model plugins share.
//!
//! - [`config`]: the TOML file, env overrides, validation as a whole;
//! - [`registry`]: plugin libraries, shadow-copied by content hash and loaded through abi_stable;
//! - [`instance`]: one model instance, its lifecycle and admission;
//! - [`router`]: the route table (requested model, modality, header → weighted backends, fallbacks);
//! - [`deployment`]: one deployed config: its plugins, instances and route table;
//! - [`runtime`]: the current deployment behind `arc-swap`, and what outlives deployments;
//! - [`reload`]: the next deployment built beside the current one, swapped in, the old drained;
//!   and the triggers (SIGHUP, the config file watch);
//! - [`server`]: the OpenAI-compatible HTTP API, health, metrics, admin;
//! - [`metrics`]: the Prometheus counters and the rendering of a gauge snapshot;
//! - [`sink`]: the plugin's event sink, bridged into a tokio channel;
//! - [`cli`]: `serve`, `run`, `plugins inspect`, `config check`.

// abi_stable's #[sabi_trait] impls expand to impls inside a const block; the lint is about that macro.
#![allow(non_local_definitions)]

pub mod cli;
pub mod config;
pub mod deployment;
pub mod instance;
pub mod metrics;
pub mod registry;
pub mod reload;
pub mod router;
pub mod runtime;
pub mod server;
pub mod sink;
