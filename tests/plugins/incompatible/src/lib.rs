//! A plugin built against a changed ABI: same root-module name as `switchyard-plugin-api`, but
//! `create_model` takes another argument and returns another type. Its manifest still claims the
//! host's API version (2.2; keep it equal to `switchyard_plugin_api::API_VERSION`) — as a plugin
//! built against an edited copy of the API crate that forgot to bump the version would — so the
//! refusal must come from abi_stable's layout check, the real safety net. The host
//! must refuse it at load with a readable message, and `switchyard plugins inspect` must still
//! describe it from the JSON symbol.
#![allow(non_local_definitions)]

use abi_stable::{
    declare_root_module_statics, export_root_module,
    library::RootModule,
    prefix_type::PrefixTypeTrait,
    sabi_types::VersionStrings,
    std_types::{RStr, RString},
    StableAbi,
};

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    pub manifest: extern "C" fn() -> RString,
    #[sabi(last_prefix_field)]
    pub create_model: extern "C" fn(kind: RStr<'_>, settings: RString, threads: u64) -> u32,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = "switchyard_plugin";
    const NAME: &'static str = "switchyard_plugin";
    // The same version string as the real API crate, so the refusal comes from the layout check.
    const VERSION_STRINGS: VersionStrings = VersionStrings::new("0.1.0");
}

const MANIFEST: &str = "{\"name\":\"incompatible\",\"version\":\"9.9.9\",\"build_id\":\"abi-break-test\",\
\"api_version\":{\"major\":2,\"minor\":2},\"models\":[{\"kind\":\"echo\",\"chat_modalities\":[\"text\"],\
\"transcription_modalities\":[]}]}\0";

extern "C" fn manifest() -> RString {
    RString::from(&MANIFEST[..MANIFEST.len() - 1])
}

extern "C" fn create_model(_kind: RStr<'_>, _settings: RString, _threads: u64) -> u32 {
    0
}

#[export_root_module]
pub fn switchyard_plugin_root_module() -> PluginModRef {
    PluginMod {
        manifest,
        create_model,
    }
    .leak_into_prefix()
}

#[no_mangle]
pub extern "C" fn switchyard_plugin_manifest_json() -> *const std::os::raw::c_char {
    MANIFEST.as_ptr().cast()
}
