//! How clips that are not 16 kHz are brought to 16 kHz, and its name parsing.

use serde::{Deserialize, Serialize};

/// How clips that are not 16 kHz reach the 16 kHz feature recipe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResampleMode {
    /// Proper resampling to 16 kHz (`scipy.signal.resample_poly(x, 16000/g, fs/g)`, Kaiser β = 5,
    /// g = gcd(16000, fs)). What a transformers caller does; the fixture's `audio_8k` /
    /// `audio_44k` cases.
    #[default]
    Polyphase,
    /// The original remote code bit for bit: above 16 kHz decimate by the integer `fs // 16000`
    /// and call the result 16 kHz (44.1 kHz is then processed as if it were 16 kHz); 8 kHz up to
    /// 16 kHz (exclusive) go through the 8 kHz "fillzero" spectrum path unresampled.
    Reference,
}

/// A resample mode name that is neither `polyphase` nor `reference`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown resample mode {0:?} (expected polyphase or reference)")]
pub struct UnknownResampleMode(pub String);

impl std::str::FromStr for ResampleMode {
    type Err = UnknownResampleMode;
    fn from_str(s: &str) -> Result<Self, UnknownResampleMode> {
        match s {
            "polyphase" => Ok(Self::Polyphase),
            "reference" => Ok(Self::Reference),
            other => Err(UnknownResampleMode(other.to_owned())),
        }
    }
}
