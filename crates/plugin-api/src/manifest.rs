use crate::version::ApiVersion;
use abi_stable::{
    std_types::{RString, RVec},
    StableAbi,
};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The kinds of input a model accepts for a request, as routes match them.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Modality {
    #[serde(rename = "text")]
    Text,
    #[serde(rename = "image")]
    Image,
    #[serde(rename = "audio")]
    Audio,
    /// A request with at least one image and at least one audio clip.
    #[serde(rename = "image+audio")]
    ImageAudio,
}

impl Modality {
    pub const ALL: [Modality; 4] = [Self::Text, Self::Image, Self::Audio, Self::ImageAudio];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Image => "image",
            Self::Audio => "audio",
            Self::ImageAudio => "image+audio",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// The modality of a request from what it carries.
    pub fn of(has_image: bool, has_audio: bool) -> Self {
        match (has_image, has_audio) {
            (false, false) => Self::Text,
            (true, false) => Self::Image,
            (false, true) => Self::Audio,
            (true, true) => Self::ImageAudio,
        }
    }
}

impl fmt::Display for Modality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The OpenAI-compatible endpoints a model kind can serve.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/audio/transcriptions`
    Transcription,
}

/// One model kind a plugin can create, and what it serves.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelKindInfo {
    pub kind: RString,
    /// Modalities accepted on the chat endpoint.
    pub chat_modalities: RVec<Modality>,
    /// Modalities accepted on the transcription endpoint (normally `[audio]`, or empty).
    pub transcription_modalities: RVec<Modality>,
}

impl ModelKindInfo {
    pub fn endpoints(&self) -> Vec<Endpoint> {
        let mut out = Vec::new();
        if !self.chat_modalities.is_empty() {
            out.push(Endpoint::Chat);
        }
        if !self.transcription_modalities.is_empty() {
            out.push(Endpoint::Transcription);
        }
        out
    }

    pub fn accepts(&self, endpoint: Endpoint, modality: Modality) -> bool {
        match endpoint {
            Endpoint::Chat => self.chat_modalities.contains(&modality),
            Endpoint::Transcription => self.transcription_modalities.contains(&modality),
        }
    }
}

/// What a plugin says about itself. Also exported as JSON through [`crate::MANIFEST_SYMBOL`].
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginManifest {
    pub name: RString,
    pub version: RString,
    /// Identifies the exact build (for example a git hash or a build timestamp).
    pub build_id: RString,
    pub api_version: ApiVersion,
    pub models: RVec<ModelKindInfo>,
}

impl PluginManifest {
    pub fn kind(&self, kind: &str) -> Option<&ModelKindInfo> {
        self.models.iter().find(|m| m.kind.as_str() == kind)
    }
}
