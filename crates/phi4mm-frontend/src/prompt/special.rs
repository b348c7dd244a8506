//! Special token ids from the checkpoint config, official values as defaults.

use super::error::PromptError;
use serde_json::Value;
use std::path::Path;

/// Text the processor substitutes for every `<|image_N|>`.
pub const IMAGE_TOKEN: &str = "<|endoftext10|>";
/// Text the processor substitutes for every `<|audio_N|>`.
pub const AUDIO_TOKEN: &str = "<|endoftext11|>";

/// Ids of the official checkpoint (docs/phi4mm-model.md §10.2).
pub const OFFICIAL_ENDOFTEXT: u32 = 199_999;
pub const OFFICIAL_IMAGE: u32 = 200_010;
pub const OFFICIAL_AUDIO: u32 = 200_011;
pub const OFFICIAL_END: u32 = 200_020;

/// Special ids of one checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecialTokens {
    pub bos: u32,
    pub pad: u32,
    /// Generation stops on any of these.
    pub eos: Vec<u32>,
    /// Image placeholder id (`<|endoftext10|>`).
    pub image: u32,
    /// Audio placeholder id (`<|endoftext11|>`).
    pub audio: u32,
    /// Text the chat template appends when no generation prompt is requested.
    pub eos_token: String,
}

impl Default for SpecialTokens {
    fn default() -> Self {
        Self {
            bos: OFFICIAL_ENDOFTEXT,
            pad: OFFICIAL_ENDOFTEXT,
            eos: vec![OFFICIAL_ENDOFTEXT, OFFICIAL_END],
            image: OFFICIAL_IMAGE,
            audio: OFFICIAL_AUDIO,
            eos_token: "<|endoftext|>".into(),
        }
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, PromptError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| PromptError::Load {
                path: path.display().to_string(),
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(PromptError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        }),
    }
}

fn id(value: Option<&Value>) -> Option<u32> {
    value
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
}

impl SpecialTokens {
    /// Reads `config.json` (both layouts: transformers-native keeps the placeholder ids in
    /// `vision_config.image_token_id` / `audio_config.audio_token_id`, the original layout at the
    /// top level) and `tokenizer_config.json` (`eos_token`). Missing keys keep the official ids.
    pub fn load(model_dir: &Path) -> Result<Self, PromptError> {
        let mut special = Self::default();
        if let Some(config) = read_json(&model_dir.join("config.json"))? {
            let pick = |paths: &[&[&str]]| {
                paths
                    .iter()
                    .find_map(|path| id(path.iter().try_fold(&config, |v, key| v.get(key))))
            };
            if let Some(v) = pick(&[&["vision_config", "image_token_id"], &["image_token_id"]]) {
                special.image = v;
            }
            if let Some(v) = pick(&[&["audio_config", "audio_token_id"], &["audio_token_id"]]) {
                special.audio = v;
            }
            if let Some(v) = id(config.get("bos_token_id")) {
                special.bos = v;
            }
            if let Some(v) = id(config.get("pad_token_id")) {
                special.pad = v;
            }
            match config.get("eos_token_id") {
                Some(Value::Array(list)) => {
                    special.eos = list.iter().filter_map(|v| id(Some(v))).collect()
                }
                Some(v) => {
                    if let Some(v) = id(Some(v)) {
                        special.eos = vec![v];
                    }
                }
                None => {}
            }
        }
        if let Some(config) = read_json(&model_dir.join("tokenizer_config.json"))? {
            match config.get("eos_token") {
                Some(Value::String(s)) => special.eos_token = s.clone(),
                Some(Value::Object(o)) => {
                    if let Some(Value::String(s)) = o.get("content") {
                        special.eos_token = s.clone();
                    }
                }
                _ => {}
            }
        }
        Ok(special)
    }
}
