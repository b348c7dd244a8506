use abi_stable::StableAbi;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The version of this API. The host accepts a plugin whose major version equals its own and
/// whose minor version is not newer than its own. A minor bump changes no layout: abi_stable
/// refuses a library whose prefix types have fewer fields than the host's, so an appended
/// prefix field would lock older plugins out (see `docs/plugin-abi.md`).
///
/// 2.0: per-token log probabilities (`Request::logprobs`, `Event::Token::logprobs`), model
/// options (`Request::model_options`) and the config directory (`HostServices::config_dir`).
///
/// 2.1: `PluginModel::resources` (`ModelResources`: KV capacity and use, resident and waiting
/// adapters) for the inference-gateway metrics, carried in `ModelStats::details_json` under
/// `RESOURCES_KEY` with no layout change; a 2.0 plugin reports none, and the host falls back.
///
/// 2.2: the optional plain C symbol `CHECK_SETTINGS_SYMBOL` (the `check:` argument of
/// `export_plugin!`), through which `switchyard config check` has a plugin check a model's
/// settings without creating it; no layout change.
pub const API_VERSION: ApiVersion = ApiVersion { major: 2, minor: 2 };

#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiVersion {
    pub major: u16,
    pub minor: u16,
}

impl ApiVersion {
    /// Whether a plugin built against `plugin` can be driven by a host built against `self`.
    pub fn accepts(self, plugin: ApiVersion) -> bool {
        self.major == plugin.major && plugin.minor <= self.minor
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_same_major_and_older_minor_only() {
        let host = ApiVersion { major: 1, minor: 2 };
        assert!(host.accepts(ApiVersion { major: 1, minor: 0 }));
        assert!(host.accepts(ApiVersion { major: 1, minor: 2 }));
        assert!(!host.accepts(ApiVersion { major: 1, minor: 3 }));
        assert!(!host.accepts(ApiVersion { major: 2, minor: 0 }));
        assert!(!host.accepts(ApiVersion { major: 0, minor: 2 }));
    }
}
