//! The stable ABI between the Switchyard host and its model plugins.
//!
//! A plugin is a `cdylib` that exports one `abi_stable` root module ([`PluginModRef`]), one
//! plain C symbol with its manifest as JSON ([`MANIFEST_SYMBOL`]) and, optionally, one that
//! checks a model's settings without creating it ([`CHECK_SETTINGS_SYMBOL`]). The host loads the library,
//! checks the layout of every type reachable from the root module (abi_stable does this at load)
//! and the [`ApiVersion`], then creates model instances from TOML/JSON settings.
//!
//! Plugin authors implement [`PluginModel`] (plain Rust) and a factory, and call
//! [`export_plugin!`]; the macro writes the FFI glue, and every call that crosses the boundary
//! catches panics and turns them into a [`PluginError`] of kind [`ErrorKind::Panic`].
//!
//! See `docs/plugin-abi.md` for the guide.

// abi_stable's #[sabi_trait] expands to impls inside a const block; the lint is about that macro.
#![allow(non_local_definitions)]

mod check;
mod error;
mod event;
mod export;
mod manifest;
mod model;
mod request;
mod services;
mod stats;
#[cfg(feature = "abi-2-0")]
pub mod v2_0;
mod version;

pub use abi_stable;

/// The plugin authors' guide, `docs/plugin-abi.md`: its complete plugin is compiled as a
/// doctest, so that the guide cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/plugin-abi.md")]
pub struct PluginAuthorsGuide;
pub use check::{check_settings_glue, CheckSettingsFn, CHECK_SETTINGS_SYMBOL};
pub use error::{ErrorKind, PluginError};
pub use event::{
    Event, EventSink, EventSinkBox, EventSink_TO, FinishReason, TokenLogprob, TokenLogprobs, Usage,
};
pub use export::{guard_create, manifest_json_cstring, PluginMod, PluginModRef, MANIFEST_SYMBOL};
pub use manifest::{Endpoint, Modality, ModelKindInfo, PluginManifest};
pub use model::{Model, ModelBox, Model_TO, PluginModel};
pub use request::{Message, Part, Prompt, Request, Role, SamplingParams};
pub use services::{resolve_settings_path, HostServices, LogLevel, SettingsFormat, SettingsText};
pub use stats::{AdapterRows, ModelResources, ModelStats, RESOURCES_KEY};
pub use version::{ApiVersion, API_VERSION};
