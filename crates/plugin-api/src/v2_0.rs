//! The 2.0 surface, frozen (cargo feature `abi-2-0`): the `Model` trait and the root module as
//! API 2.0 shipped them, and 2.0's export glue, whose `stats` carries no resources (2.1 adds
//! them to `ModelStats::details_json`). A plugin exported through
//! [`export_plugin_v2_0!`](crate::export_plugin_v2_0) has the vtable, the stats and the manifest
//! of a plugin built against 2.0, although it is built from today's sources. It exists so that a test
//! can prove that the host still loads and serves such plugins; new plugins use
//! [`crate::export_plugin!`].
//!
//! The names (`Model`, `PluginMod`) are those of the current surface on purpose: abi_stable
//! compares type names and the package, never the module path, so these types are checked at
//! load exactly as the 2.0 ones were. Change nothing here but to fix a divergence from 2.0.

use crate::{
    error::PluginError,
    event::EventSinkBox,
    manifest::PluginManifest,
    model::PluginModel,
    request::Request,
    services::{HostServices, SettingsText},
    stats::ModelStats,
    version::ApiVersion,
};
use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings, sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, RResult, RStr},
    StableAbi,
};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The version such a plugin declares.
pub const API_VERSION: ApiVersion = ApiVersion { major: 2, minor: 0 };

/// `Model` as of 2.0.
#[sabi_trait]
pub trait Model: Send + Sync {
    fn warm(&self) -> RResult<(), PluginError>;
    fn submit(&self, request: Request, sink: EventSinkBox) -> RResult<(), PluginError>;
    fn cancel(&self, request_id: u64) -> bool;
    fn stats(&self) -> ModelStats;
    fn drain(&self);
    #[sabi(last_prefix_field)]
    fn shutdown(&self);
}

pub type ModelBox = Model_TO<'static, RBox<()>>;

/// The root module as of 2.0.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    pub manifest: extern "C" fn() -> PluginManifest,
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

/// A [`PluginModel`] behind the 2.0 methods only, each under `catch_unwind` as in 2.0.
struct Guarded<M>(M);

impl<M: PluginModel> Model for Guarded<M> {
    fn warm(&self) -> RResult<(), PluginError> {
        catch_unwind(AssertUnwindSafe(|| self.0.warm()))
            .unwrap_or_else(|p| Err(PluginError::from_panic("warm", p)))
            .into()
    }
    fn submit(&self, request: Request, sink: EventSinkBox) -> RResult<(), PluginError> {
        catch_unwind(AssertUnwindSafe(|| self.0.submit(request, sink)))
            .unwrap_or_else(|p| Err(PluginError::from_panic("submit", p)))
            .into()
    }
    fn cancel(&self, request_id: u64) -> bool {
        catch_unwind(AssertUnwindSafe(|| self.0.cancel(request_id))).unwrap_or(false)
    }
    fn stats(&self) -> ModelStats {
        catch_unwind(AssertUnwindSafe(|| self.0.stats())).unwrap_or_default()
    }
    fn drain(&self) {
        let _ = catch_unwind(AssertUnwindSafe(|| self.0.drain()));
    }
    fn shutdown(&self) {
        let _ = catch_unwind(AssertUnwindSafe(|| self.0.shutdown()));
    }
}

/// [`crate::guard_create`] for the 2.0 surface. Used by [`crate::export_plugin_v2_0!`].
pub fn guard_create<M, F>(create: F) -> RResult<ModelBox, PluginError>
where
    M: PluginModel,
    F: FnOnce() -> Result<M, PluginError>,
{
    match catch_unwind(AssertUnwindSafe(create)) {
        Ok(Ok(model)) => RResult::ROk(Model_TO::from_value(
            Guarded(model),
            abi_stable::sabi_trait::TD_Opaque,
        )),
        Ok(Err(e)) => RResult::RErr(e),
        Err(payload) => RResult::RErr(PluginError::from_panic("create_model", payload)),
    }
}

/// The manifest a 2.0 plugin declares: `manifest` with the 2.0 API version.
pub fn manifest(mut manifest: PluginManifest) -> PluginManifest {
    manifest.api_version = API_VERSION;
    manifest
}

/// [`crate::export_plugin!`] as of 2.0: the same arguments, the 2.0 root module and vtable, and
/// the manifest's API version set to 2.0.
#[macro_export]
macro_rules! export_plugin_v2_0 {
    (manifest: $manifest:path, create: $create:path $(,)?) => {
        fn __switchyard_manifest_v2_0() -> $crate::PluginManifest {
            $crate::v2_0::manifest($manifest())
        }

        #[$crate::abi_stable::export_root_module]
        pub fn switchyard_plugin_root_module() -> $crate::v2_0::PluginModRef {
            // Named so as not to shadow the plugin's own functions, which `$manifest` and
            // `$create` may name `manifest` or `create_model`.
            extern "C" fn __switchyard_manifest() -> $crate::PluginManifest {
                match ::std::panic::catch_unwind(__switchyard_manifest_v2_0) {
                    Ok(m) => m,
                    Err(_) => ::std::process::abort(),
                }
            }
            extern "C" fn __switchyard_create_model(
                kind: $crate::abi_stable::std_types::RStr<'_>,
                settings: $crate::SettingsText,
                services: $crate::HostServices,
            ) -> $crate::abi_stable::std_types::RResult<$crate::v2_0::ModelBox, $crate::PluginError>
            {
                $crate::v2_0::guard_create(move || $create(kind.as_str(), settings, services))
            }
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::v2_0::PluginMod {
                manifest: __switchyard_manifest,
                create_model: __switchyard_create_model,
            }
            .leak_into_prefix()
        }

        #[no_mangle]
        pub extern "C" fn switchyard_plugin_manifest_json() -> *const ::std::os::raw::c_char {
            static JSON: ::std::sync::OnceLock<::std::ffi::CString> = ::std::sync::OnceLock::new();
            match ::std::panic::catch_unwind(|| {
                JSON.get_or_init(|| $crate::manifest_json_cstring(&__switchyard_manifest_v2_0()))
                    .as_ptr()
            }) {
                Ok(ptr) => ptr,
                Err(_) => ::std::ptr::null(),
            }
        }
    };
}
