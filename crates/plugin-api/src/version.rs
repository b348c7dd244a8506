use abi_stable::StableAbi;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The version of this API. The host accepts a plugin whose major version equals its own and
/// whose minor version is not newer than its own (a minor bump only adds things the host
/// may ignore, such as new prefix fields appended after the last one).
///
/// 2.0: per-token log probabilities (`Request::logprobs`, `Event::Token::logprobs`), model
/// options (`Request::model_options`) and the config directory (`HostServices::config_dir`).
///
/// 2.1: raw prompts for `/v1/completions` (`Model::submit_prompt` with a `Prompt`, appended
/// after the last prefix method; a 2.0 plugin's model answers it `Unsupported`).
pub const API_VERSION: ApiVersion = ApiVersion { major: 2, minor: 1 };

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
