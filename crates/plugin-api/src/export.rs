use crate::{
    error::PluginError,
    manifest::PluginManifest,
    model::{Guarded, ModelBox, PluginModel},
    services::{HostServices, SettingsText},
};
use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{RResult, RStr},
    StableAbi,
};
use std::{
    ffi::CString,
    panic::{catch_unwind, AssertUnwindSafe},
};

/// The name of the plain C symbol (`extern "C" fn() -> *const c_char`) that returns the plugin's
/// manifest as a NUL-terminated JSON string with `'static` lifetime. It is read with `libloading`,
/// without any layout check, so tools can describe even an incompatible plugin.
pub const MANIFEST_SYMBOL: &str = "switchyard_plugin_manifest_json";

/// The root module each plugin exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    /// The plugin's manifest (name, version, build id, API version, model kinds).
    pub manifest: extern "C" fn() -> PluginManifest,

    /// Creates a model instance of `kind` from its settings.
    #[sabi(last_prefix_field)]
    pub create_model: extern "C" fn(
        kind: RStr<'_>,
        settings: SettingsText,
        services: HostServices,
    ) -> RResult<ModelBox, PluginError>,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = "switchyard_plugin";
    const NAME: &'static str = "switchyard_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// Runs a plugin's factory behind a panic guard and wraps the model for the ABI.
/// Used by [`crate::export_plugin!`]; not meant to be called directly.
pub fn guard_create<M, F>(create: F) -> RResult<ModelBox, PluginError>
where
    M: PluginModel,
    F: FnOnce() -> Result<M, PluginError>,
{
    match catch_unwind(AssertUnwindSafe(create)) {
        Ok(Ok(model)) => RResult::ROk(Guarded::boxed(model)),
        Ok(Err(e)) => RResult::RErr(e),
        Err(payload) => RResult::RErr(PluginError::from_panic("create_model", payload)),
    }
}

/// Serialises a manifest for [`MANIFEST_SYMBOL`]. Used by [`crate::export_plugin!`].
pub fn manifest_json_cstring(manifest: &PluginManifest) -> CString {
    let json = serde_json::to_string(manifest).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    CString::new(json).unwrap_or_default()
}

/// Exports a plugin: the abi_stable root module and the manifest JSON symbol.
///
/// ```text
/// switchyard_plugin_api::export_plugin! {
///     manifest: my_manifest,   // fn() -> PluginManifest
///     create: my_create,       // fn(&str, SettingsText, HostServices) -> Result<impl PluginModel, PluginError>
///     check: my_check,         // optional (API 2.2): fn(&str, SettingsText, &Path) -> Result<(), PluginError>
/// }
/// ```
/// Every function runs behind a panic guard. `check` answers whether `create` would accept
/// a kind and its settings, without creating anything (see [`crate::CHECK_SETTINGS_SYMBOL`]);
/// its `&Path` is the directory that relative paths in the settings start from.
#[macro_export]
macro_rules! export_plugin {
    (manifest: $manifest:path, create: $create:path, check: $check:path $(,)?) => {
        $crate::export_plugin! { manifest: $manifest, create: $create }

        /// # Safety
        /// The contract of `switchyard_plugin_api::CheckSettingsFn`.
        #[no_mangle]
        pub unsafe extern "C" fn switchyard_plugin_check_settings(
            kind: *const ::std::os::raw::c_char,
            settings_json: *const ::std::os::raw::c_char,
            config_dir: *const ::std::os::raw::c_char,
        ) -> *const ::std::os::raw::c_char {
            // SAFETY: the host passes what the symbol's contract asks for.
            unsafe { $crate::check_settings_glue(kind, settings_json, config_dir, $check) }
        }
    };
    (manifest: $manifest:path, create: $create:path $(,)?) => {
        #[$crate::abi_stable::export_root_module]
        pub fn switchyard_plugin_root_module() -> $crate::PluginModRef {
            // Named so as not to shadow the plugin's own functions, which `$manifest` and
            // `$create` may name `manifest` or `create_model`.
            extern "C" fn __switchyard_manifest() -> $crate::PluginManifest {
                // A manifest is built from constants; a panic here is a bug in the plugin and
                // there is no error channel, so abort loudly rather than unwind across FFI.
                match ::std::panic::catch_unwind($manifest) {
                    Ok(m) => m,
                    Err(_) => ::std::process::abort(),
                }
            }
            extern "C" fn __switchyard_create_model(
                kind: $crate::abi_stable::std_types::RStr<'_>,
                settings: $crate::SettingsText,
                services: $crate::HostServices,
            ) -> $crate::abi_stable::std_types::RResult<$crate::ModelBox, $crate::PluginError> {
                $crate::guard_create(move || $create(kind.as_str(), settings, services))
            }
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::PluginMod {
                manifest: __switchyard_manifest,
                create_model: __switchyard_create_model,
            }
            .leak_into_prefix()
        }

        #[no_mangle]
        pub extern "C" fn switchyard_plugin_manifest_json() -> *const ::std::os::raw::c_char {
            static JSON: ::std::sync::OnceLock<::std::ffi::CString> = ::std::sync::OnceLock::new();
            match ::std::panic::catch_unwind(|| {
                JSON.get_or_init(|| $crate::manifest_json_cstring(&$manifest()))
                    .as_ptr()
            }) {
                Ok(ptr) => ptr,
                Err(_) => ::std::ptr::null(),
            }
        }
    };
}
