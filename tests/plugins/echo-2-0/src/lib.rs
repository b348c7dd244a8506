//! Fixture plugin `echo-2-0`: the echo model (see `switchyard-echo-core`) exported through the
//! frozen API 2.0 surface (`switchyard_plugin_api::v2_0`), so its vtable has no `resources` and
//! its manifest says 2.0: what a plugin built before API 2.1 looks like to the host.
#![allow(non_local_definitions)]

const FLAVOUR: switchyard_echo_core::Flavour = switchyard_echo_core::Flavour {
    plugin: "echo-2-0",
    version: env!("CARGO_PKG_VERSION"),
    kind: "echo",
    media: false,
};

fn echo_manifest() -> switchyard_plugin_api::PluginManifest {
    switchyard_echo_core::manifest(FLAVOUR)
}

fn echo_create(
    kind: &str,
    settings: switchyard_plugin_api::SettingsText,
    services: switchyard_plugin_api::HostServices,
) -> Result<switchyard_echo_core::EchoModel, switchyard_plugin_api::PluginError> {
    switchyard_echo_core::create(FLAVOUR, kind, settings, services)
}

switchyard_plugin_api::export_plugin_v2_0! { manifest: echo_manifest, create: echo_create }
