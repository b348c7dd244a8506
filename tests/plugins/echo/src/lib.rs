//! Fixture plugin `echo` version 1.0.0 (see `switchyard-echo-core`).
#![allow(non_local_definitions)]

switchyard_echo_core::export_echo!(switchyard_echo_core::Flavour {
    plugin: "echo",
    version: env!("CARGO_PKG_VERSION"),
    kind: "echo",
    media: false,
});
