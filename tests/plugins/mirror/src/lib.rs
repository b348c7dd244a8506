//! Fixture plugin `mirror` version 0.3.0 (see `switchyard-echo-core`).
#![allow(non_local_definitions)]

switchyard_echo_core::export_echo!(switchyard_echo_core::Flavour {
    plugin: "mirror",
    version: env!("CARGO_PKG_VERSION"),
    kind: "mirror",
    media: true,
});
