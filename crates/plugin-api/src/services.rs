use abi_stable::{
    std_types::{RStr, RString},
    StableAbi,
};
use serde::de::DeserializeOwned;

#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// What the host offers a model instance.
#[repr(C)]
#[derive(StableAbi, Clone)]
pub struct HostServices {
    /// Writes one log record into the host's `tracing` output: (level, target, message).
    pub log: extern "C" fn(LogLevel, RStr<'_>, RStr<'_>),
    /// A directory the instance may use for caches (created by the host, persistent).
    pub cache_dir: RString,
    /// How many threads the instance should use for compute.
    pub thread_budget: u32,
    /// The instance name from the host configuration (for log messages).
    pub instance_name: RString,
    /// The directory of the host's configuration file (absolute). Relative paths in a model's
    /// settings mean relative to it, as the host's own plugin paths do.
    pub config_dir: RString,
}

impl HostServices {
    /// A settings path as the operator meant it: relative paths resolve against
    /// [`HostServices::config_dir`].
    pub fn resolve_path(&self, path: &std::path::Path) -> std::path::PathBuf {
        resolve_settings_path(std::path::Path::new(self.config_dir.as_str()), path)
    }

    pub fn log(&self, level: LogLevel, message: &str) {
        (self.log)(
            level,
            RStr::from(self.instance_name.as_str()),
            RStr::from(message),
        );
    }
    pub fn info(&self, message: &str) {
        self.log(LogLevel::Info, message)
    }
    pub fn warn(&self, message: &str) {
        self.log(LogLevel::Warn, message)
    }
    pub fn error(&self, message: &str) {
        self.log(LogLevel::Error, message)
    }
}

/// A settings path as the operator meant it: a relative `path` starts from `config_dir` (the
/// host config's directory), unless that is empty.
pub fn resolve_settings_path(
    config_dir: &std::path::Path,
    path: &std::path::Path,
) -> std::path::PathBuf {
    if path.is_relative() && !config_dir.as_os_str().is_empty() {
        config_dir.join(path)
    } else {
        path.to_path_buf()
    }
}

#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingsFormat {
    Toml,
    Json,
}

/// A plugin-specific settings table, as text.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct SettingsText {
    pub format: SettingsFormat,
    pub text: RString,
}

impl SettingsText {
    pub fn json(text: impl Into<String>) -> Self {
        Self {
            format: SettingsFormat::Json,
            text: RString::from(text.into()),
        }
    }
    pub fn toml(text: impl Into<String>) -> Self {
        Self {
            format: SettingsFormat::Toml,
            text: RString::from(text.into()),
        }
    }

    /// Parses the settings into the plugin's own type. Empty text means an empty table. An error
    /// names the key at fault (`settings.slots: invalid type: …`), for the operator reads it
    /// beside a config file, not the JSON the host made of it.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, String> {
        let text = self.text.as_str();
        let at = |path: &serde_path_to_error::Path| match path.to_string().as_str() {
            "." => "settings".to_string(),
            path => format!("settings.{path}"),
        };
        match self.format {
            SettingsFormat::Json => {
                let text = if text.trim().is_empty() { "{}" } else { text };
                let mut json = serde_json::Deserializer::from_str(text);
                serde_path_to_error::deserialize(&mut json).map_err(|e| {
                    // The position is in the JSON the host made of the table, not in any file
                    // the operator wrote: the key names the place.
                    let message = e.inner().to_string();
                    let message = match message.rsplit_once(" at line ") {
                        Some((message, _)) => message.to_string(),
                        None => message,
                    };
                    format!("{}: {message}", at(e.path()))
                })
            }
            SettingsFormat::Toml => {
                let toml =
                    toml::Deserializer::parse(text).map_err(|e| format!("settings (TOML): {e}"))?;
                serde_path_to_error::deserialize(toml)
                    .map_err(|e| format!("{}: {}", at(e.path()), e.inner()))
            }
        }
    }
}
