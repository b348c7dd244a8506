//! Plugin libraries. Each file is copied into a private shadow directory under the name of its
//! sha256 before it is opened, so an operator can overwrite the original during a deploy and two
//! versions can be mapped at once. Libraries are never unmapped (abi_stable leaks them on purpose:
//! unloading Rust code with thread-local destructors is unsound), so a reload that replaces a
//! version leaves the old one mapped as a *retired* library; their number is capped.

use abi_stable::library::{lib_header_from_path, LibraryError};
use sha2::{Digest, Sha256};
use std::{
    collections::HashMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};
use switchyard_plugin_api::{
    CheckSettingsFn, PluginManifest, PluginModRef, API_VERSION, CHECK_SETTINGS_SYMBOL,
    MANIFEST_SYMBOL,
};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("plugin {name:?}: cannot read {path}: {source}")]
    Read {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin {name:?}: sha256 pin mismatch for {path}: pinned {pinned}, file has {actual}")]
    PinMismatch {
        name: String,
        path: PathBuf,
        pinned: String,
        actual: String,
    },
    #[error("plugin {name:?}: cannot write shadow copy {path}: {source}")]
    Shadow {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin {name:?}: {path} is not a Switchyard plugin: {reason}")]
    NotAPlugin {
        name: String,
        path: PathBuf,
        reason: ManifestError,
    },
    #[error("plugin {name:?}: {path} was built for plugin API {plugin_api}; this host speaks {host_api}")]
    ApiVersion {
        name: String,
        path: PathBuf,
        plugin_api: String,
        host_api: String,
    },
    #[error("plugin {name:?}: {path} has an incompatible ABI and was refused: {reason}")]
    Incompatible {
        name: String,
        path: PathBuf,
        reason: LayoutError,
    },
    #[error("plugin {name:?}: the library is named {actual:?} in its manifest")]
    NameMismatch { name: String, actual: String },
    #[error(
        "loading would keep {would_be} retired plugin libraries mapped, over the cap of {cap} \
         (server.retired_library_cap); restart the process to unmap them"
    )]
    RetiredCap { would_be: usize, cap: usize },
}

/// Why a library's manifest could not be read through its plain C symbol.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot open library: {0}")]
    Open(libloading::Error),
    #[error("it does not export {}", MANIFEST_SYMBOL)]
    NoSymbol,
    #[error("{} returned null", MANIFEST_SYMBOL)]
    Null,
    #[error("manifest JSON is invalid: {0}")]
    Json(serde_json::Error),
}

/// Why abi_stable refused a library's root module: what differs, and the first lines of its
/// report (its layout errors are long type dumps).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {detail}")]
pub struct LayoutError {
    what: &'static str,
    detail: String,
}

/// One mapped plugin library.
pub struct LoadedPlugin {
    pub sha256: String,
    pub manifest: PluginManifest,
    pub module: PluginModRef,
    pub shadow_path: PathBuf,
    /// Where it was loaded from (the operator's path, which may since have been overwritten).
    pub original_path: PathBuf,
}

impl LoadedPlugin {
    pub fn version(&self) -> &str {
        self.manifest.version.as_str()
    }
    pub fn label(&self) -> String {
        format!("{}@{}", self.manifest.name, self.manifest.version)
    }
}

pub struct Registry {
    shadow_dir: PathBuf,
    loaded: Mutex<HashMap<String, Arc<LoadedPlugin>>>,
}

impl Registry {
    /// `shadow_dir` is created with mode 0700.
    pub fn new(shadow_dir: PathBuf) -> std::io::Result<Self> {
        fs::create_dir_all(&shadow_dir)?;
        set_private(&shadow_dir)?;
        Ok(Self {
            shadow_dir,
            loaded: Mutex::new(HashMap::new()),
        })
    }

    pub fn shadow_dir(&self) -> &Path {
        &self.shadow_dir
    }

    /// Number of libraries mapped in this process.
    pub fn loaded_count(&self) -> usize {
        self.loaded.lock().unwrap().len()
    }

    pub fn loaded(&self) -> Vec<Arc<LoadedPlugin>> {
        self.loaded.lock().unwrap().values().cloned().collect()
    }

    pub fn is_loaded(&self, sha256: &str) -> bool {
        self.loaded.lock().unwrap().contains_key(sha256)
    }

    /// Loads (or finds already loaded) the plugin at `path`, verifying an optional sha256 pin.
    pub fn load(
        &self,
        name: &str,
        path: &Path,
        pin: Option<&str>,
    ) -> Result<Arc<LoadedPlugin>, RegistryError> {
        let bytes = fs::read(path).map_err(|source| RegistryError::Read {
            name: name.into(),
            path: path.into(),
            source,
        })?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if let Some(pin) = pin {
            if !pin.eq_ignore_ascii_case(&sha256) {
                return Err(RegistryError::PinMismatch {
                    name: name.into(),
                    path: path.into(),
                    pinned: pin.to_ascii_lowercase(),
                    actual: sha256,
                });
            }
        }
        if let Some(existing) = self.loaded.lock().unwrap().get(&sha256) {
            return Ok(existing.clone());
        }
        let shadow_path = self.shadow_dir.join(format!("{sha256}.so"));
        write_shadow(&shadow_path, &bytes).map_err(|source| RegistryError::Shadow {
            name: name.into(),
            path: shadow_path.clone(),
            source,
        })?;

        // Read the manifest JSON first: it works on any build, so an API mismatch gets a plain
        // message instead of abi_stable's layout dump.
        let json_manifest =
            read_manifest_json(&shadow_path).map_err(|reason| RegistryError::NotAPlugin {
                name: name.into(),
                path: path.into(),
                reason,
            })?;
        if !API_VERSION.accepts(json_manifest.api_version) {
            return Err(RegistryError::ApiVersion {
                name: name.into(),
                path: path.into(),
                plugin_api: json_manifest.api_version.to_string(),
                host_api: API_VERSION.to_string(),
            });
        }
        let module =
            open_root_module(&shadow_path).map_err(|reason| RegistryError::Incompatible {
                name: name.into(),
                path: path.into(),
                reason,
            })?;
        let manifest = (module.manifest())();
        if manifest.name.as_str() != json_manifest.name.as_str() {
            return Err(RegistryError::NameMismatch {
                name: name.into(),
                actual: manifest.name.to_string(),
            });
        }
        let plugin = Arc::new(LoadedPlugin {
            sha256: sha256.clone(),
            manifest,
            module,
            shadow_path,
            original_path: path.to_path_buf(),
        });
        self.loaded.lock().unwrap().insert(sha256, plugin.clone());
        Ok(plugin)
    }

    /// Refuses a load plan that would leave more than `cap` retired libraries mapped:
    /// `new_shas` are the libraries the next deployment uses.
    pub fn check_retired_cap(&self, next_shas: &[String], cap: usize) -> Result<(), RegistryError> {
        let loaded = self.loaded.lock().unwrap();
        let fresh = next_shas
            .iter()
            .filter(|s| !loaded.contains_key(*s))
            .count();
        let would_be_mapped = loaded.len() + fresh;
        let mut used: Vec<&String> = next_shas.iter().collect();
        used.sort();
        used.dedup();
        let would_be = would_be_mapped - used.len();
        if would_be > cap {
            return Err(RegistryError::RetiredCap { would_be, cap });
        }
        Ok(())
    }
}

/// sha256 of a file, hex.
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    Ok(hex::encode(Sha256::digest(fs::read(path)?)))
}

fn write_shadow(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if path.exists() {
        // Content-addressed: an existing file with this name has these bytes, unless someone
        // tampered with our private directory; check rather than trust.
        if fs::read(path)? == bytes {
            return Ok(());
        }
        fs::remove_file(path)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}

#[cfg(unix)]
fn set_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

#[cfg(not(unix))]
fn set_private(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Reads the manifest through the plain C symbol, without any layout check.
pub fn read_manifest_json(path: &Path) -> Result<PluginManifest, ManifestError> {
    let json = read_manifest_text(path)?;
    serde_json::from_str(&json).map_err(ManifestError::Json)
}

/// The raw manifest JSON text of a library.
pub fn read_manifest_text(path: &Path) -> Result<String, ManifestError> {
    // SAFETY: opening a library runs its initialisers; the operator configured this file as a
    // plugin. The symbol's contract (a static NUL-terminated string) is the plugin ABI's.
    unsafe {
        let lib = libloading::Library::new(path).map_err(ManifestError::Open)?;
        let text = {
            let symbol: libloading::Symbol<unsafe extern "C" fn() -> *const std::os::raw::c_char> =
                lib.get(MANIFEST_SYMBOL.as_bytes())
                    .map_err(|_| ManifestError::NoSymbol)?;
            let ptr = symbol();
            if ptr.is_null() {
                return Err(ManifestError::Null);
            }
            std::ffi::CStr::from_ptr(ptr).to_string_lossy().into_owned()
        };
        // Never unmap: the same file may be (or become) loaded through abi_stable, and Rust
        // libraries are not safe to unload.
        std::mem::forget(lib);
        Ok(text)
    }
}

/// The minor version (of API 2) that introduced the settings-check symbol.
const CHECK_SETTINGS_SINCE_MINOR: u16 = 2;

/// What a plugin said of a model's settings through its settings check (plugin API 2.2).
#[derive(Debug, PartialEq, Eq)]
pub enum SettingsVerdict {
    Accepted,
    Refused(String),
    /// The plugin exports no check (built before API 2.2, or without one): its settings are
    /// checked when an instance is created.
    NotChecked,
}

/// Asks the plugin library at `path` whether it would create a model of `kind` from
/// `settings` (the JSON that creating it would get), through its optional check symbol:
/// nothing is created. `config_dir` is where relative paths in the settings start.
pub fn check_settings(
    path: &Path,
    kind: &str,
    settings: &serde_json::Value,
    config_dir: &Path,
) -> Result<SettingsVerdict, ManifestError> {
    use std::{ffi::CString, os::unix::ffi::OsStrExt};
    let (Ok(kind), Ok(settings), Ok(config_dir)) = (
        CString::new(kind),
        CString::new(settings.to_string()),
        CString::new(config_dir.as_os_str().as_bytes()),
    ) else {
        return Ok(SettingsVerdict::Refused(
            "the kind, the settings or the config's directory holds a NUL byte".into(),
        ));
    };
    if !may_export_settings_check(path)? {
        return Ok(SettingsVerdict::NotChecked);
    }
    // SAFETY: the library declares an API this host accepts that has the symbol, whose
    // contract is `CheckSettingsFn`'s: it reads the three strings during the call and answers
    // null or a string valid until the next call on this thread, copied at once.
    unsafe {
        let lib = libloading::Library::new(path).map_err(ManifestError::Open)?;
        let verdict = match lib.get::<CheckSettingsFn>(CHECK_SETTINGS_SYMBOL.as_bytes()) {
            Err(_) => SettingsVerdict::NotChecked,
            Ok(check) => {
                let refusal = check(kind.as_ptr(), settings.as_ptr(), config_dir.as_ptr());
                if refusal.is_null() {
                    SettingsVerdict::Accepted
                } else {
                    SettingsVerdict::Refused(
                        std::ffi::CStr::from_ptr(refusal)
                            .to_string_lossy()
                            .into_owned(),
                    )
                }
            }
        };
        std::mem::forget(lib); // as for the manifest
        Ok(verdict)
    }
}

/// Whether the library's API has the settings check symbol: its type is fixed within this
/// major version from 2.2 on, and a library built against another API may export the name with
/// another signature.
fn may_export_settings_check(path: &Path) -> Result<bool, ManifestError> {
    let api = read_manifest_json(path)?.api_version;
    Ok(API_VERSION.accepts(api) && api.minor >= CHECK_SETTINGS_SINCE_MINOR)
}

/// Whether the library exports a settings check that this host calls (`plugins inspect`).
pub fn exports_settings_check(path: &Path) -> Result<bool, ManifestError> {
    if !may_export_settings_check(path)? {
        return Ok(false);
    }
    // SAFETY: only looked up, not called.
    unsafe {
        let lib = libloading::Library::new(path).map_err(ManifestError::Open)?;
        let found = lib
            .get::<CheckSettingsFn>(CHECK_SETTINGS_SYMBOL.as_bytes())
            .is_ok();
        std::mem::forget(lib); // as for the manifest
        Ok(found)
    }
}

/// Opens the abi_stable root module with full layout and version checks.
pub fn open_root_module(path: &Path) -> Result<PluginModRef, LayoutError> {
    let header = lib_header_from_path(path).map_err(describe_library_error)?;
    header
        .init_root_module::<PluginModRef>()
        .map_err(describe_library_error)
}

fn describe_library_error(error: LibraryError) -> LayoutError {
    // Keep the headline and a few lines of detail.
    let text = error.to_string();
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(8)
        .collect();
    if text.lines().count() > 8 {
        lines.push("...");
    }
    let what = match error {
        LibraryError::AbiInstability(_) => "type layouts differ from this host's plugin API",
        LibraryError::IncompatibleVersionNumber { .. } => {
            "plugin API crate version is incompatible"
        }
        _ => "library error",
    };
    LayoutError {
        what,
        detail: lines.join(" | "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_no_library_is_refused_by_name_and_path() {
        let dir = std::env::temp_dir().join(format!("switchyard-registry-{}", std::process::id()));
        let file = dir.join("notes.so");
        fs::create_dir_all(&dir).unwrap();
        fs::write(&file, b"not an ELF file").unwrap();
        let error = read_manifest_text(&file).unwrap_err();
        assert!(matches!(error, ManifestError::Open(_)), "{error:?}");
        assert!(
            error.to_string().starts_with("cannot open library: "),
            "{error}"
        );

        let registry = Registry::new(dir.join("shadow")).unwrap();
        let error = registry.load("p", &file, None).err().expect("refused");
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "plugin \"p\": {} is not a Switchyard plugin: cannot open library: ",
                file.display()
            )),
            "{text}"
        );
        assert_eq!(registry.loaded_count(), 0);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn manifest_errors_name_the_symbol() {
        assert_eq!(
            ManifestError::NoSymbol.to_string(),
            "it does not export switchyard_plugin_manifest_json"
        );
        assert_eq!(
            ManifestError::Null.to_string(),
            "switchyard_plugin_manifest_json returned null"
        );
    }
}
