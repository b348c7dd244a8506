//! What a request runs with besides its prompt: the LoRA adapter of its rows and the audio
//! projection of its clips. A request picks them once ([`AdapterChoice::resolve`]) and its row
//! carries the result through every decoder step, so the adapter is chosen per row and there is
//! no model-wide adapter switch.

use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::checkpoint::LoraAdapter;

/// Which LoRA a batch row runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AdapterMode {
    #[default]
    None,
    Speech,
    Vision,
}

impl AdapterMode {
    /// The checkpoint adapter this mode adds to the base weights, if any.
    pub fn lora(self) -> Option<LoraAdapter> {
        match self {
            AdapterMode::None => None,
            AdapterMode::Speech => Some(LoraAdapter::Speech),
            AdapterMode::Vision => Some(LoraAdapter::Vision),
        }
    }
}

/// Which audio projection a request's clips go through: `speech` without images, `vision` with
/// them (the reference's `vision_speech` projection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AudioBranch {
    #[default]
    Speech,
    Vision,
}

/// A request's adapter selection. Clients write it as `auto`, `none`, `speech` or `vision`
/// (`model_options.adapter`, `phi4mm --adapter`, a `phi4mm batch` request's `adapter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AdapterChoice {
    /// From the request's media, as the reference's input modes.
    #[default]
    Auto,
    /// This adapter, whatever the media.
    Fixed(AdapterMode),
}

impl AdapterChoice {
    /// The names clients write, in the order of [`AdapterChoice::ALL`].
    pub const NAMES: [&'static str; 4] = ["auto", "none", "speech", "vision"];
    pub const ALL: [AdapterChoice; 4] = [
        AdapterChoice::Auto,
        AdapterChoice::Fixed(AdapterMode::None),
        AdapterChoice::Fixed(AdapterMode::Speech),
        AdapterChoice::Fixed(AdapterMode::Vision),
    ];

    /// The row's adapter and audio branch for a request with these media. `Auto` is the
    /// reference's input modes: text → none, image(s) → vision, audio only → speech, image(s) +
    /// audio → vision. The audio branch always follows the media (vision-speech with an image),
    /// also under a pinned adapter.
    pub fn resolve(self, has_images: bool, has_audio: bool) -> (AdapterMode, AudioBranch) {
        let branch = if has_images && has_audio {
            AudioBranch::Vision
        } else {
            AudioBranch::Speech
        };
        let mode = match self {
            AdapterChoice::Fixed(mode) => mode,
            AdapterChoice::Auto if has_images => AdapterMode::Vision,
            AdapterChoice::Auto if has_audio => AdapterMode::Speech,
            AdapterChoice::Auto => AdapterMode::None,
        };
        (mode, branch)
    }
}

/// A name that is none of [`AdapterChoice::NAMES`].
#[derive(Debug, thiserror::Error)]
#[error("unknown adapter {0:?}: expected one of auto, none, speech, vision")]
pub struct UnknownAdapter(pub String);

impl FromStr for AdapterChoice {
    type Err = UnknownAdapter;

    fn from_str(s: &str) -> Result<Self, UnknownAdapter> {
        Self::NAMES
            .iter()
            .position(|&name| name == s)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| UnknownAdapter(s.to_string()))
    }
}

/// As a derived unit-variant enum would, so a bad name reads "unknown variant `audio`, expected
/// one of `auto`, `none`, `speech`, `vision`".
impl<'de> Deserialize<'de> for AdapterChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Names;
        impl Visitor<'_> for Names {
            type Value = AdapterChoice;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("one of `auto`, `none`, `speech`, `vision`")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<AdapterChoice, E> {
                v.parse()
                    .map_err(|_| E::unknown_variant(v, &AdapterChoice::NAMES))
            }
        }
        deserializer.deserialize_str(Names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_media_and_the_branch_follows_them_always() {
        use AdapterMode as M;
        use AudioBranch as B;
        let auto = AdapterChoice::Auto;
        assert_eq!(auto.resolve(false, false), (M::None, B::Speech));
        assert_eq!(auto.resolve(true, false), (M::Vision, B::Speech));
        assert_eq!(auto.resolve(false, true), (M::Speech, B::Speech));
        assert_eq!(auto.resolve(true, true), (M::Vision, B::Vision));
        let pinned = AdapterChoice::Fixed(M::Speech);
        assert_eq!(pinned.resolve(true, true), (M::Speech, B::Vision));
        assert_eq!(pinned.resolve(false, false), (M::Speech, B::Speech));
    }

    #[test]
    fn names_parse_both_ways() {
        for (name, choice) in AdapterChoice::NAMES.iter().zip(AdapterChoice::ALL) {
            assert_eq!(name.parse::<AdapterChoice>().unwrap(), choice);
            let json = serde_json::Value::String(name.to_string());
            assert_eq!(
                serde_json::from_value::<AdapterChoice>(json).unwrap(),
                choice
            );
        }
        assert!("audio".parse::<AdapterChoice>().is_err());
        let e = serde_json::from_value::<AdapterChoice>("audio".into()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown variant `audio`, expected one of `auto`, `none`, `speech`, `vision`"
        );
    }
}
