//! A phi4mm request's `model_options` (the OpenAI body's extension object): what a client may pin
//! beyond the OpenAI fields. Unknown keys are refused, so a typo never passes silently.

use serde::Deserialize;

use crate::adapter::AdapterChoice;

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestOptions {
    /// `auto` (from the modality: text → none, audio only → speech, image(s) (+ audio) →
    /// vision), or the adapter to pin.
    #[serde(default)]
    pub adapter: AdapterChoice,
    /// The prompt as token ids, placeholders already expanded (one id per image or audio row),
    /// instead of the chat template over the messages' text. The messages then carry only their
    /// media, which bind to the placeholder runs in order, as `phi4mm generate --input-ids`.
    #[serde(default)]
    pub input_ids: Option<Vec<u32>>,
}

impl RequestOptions {
    /// Parses the options object of a request (`None`: the client sent none).
    pub fn from_json(
        options: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Self, OptionsError> {
        match options {
            None => Ok(Self::default()),
            Some(map) => {
                serde_json::from_value(serde_json::Value::Object(map)).map_err(OptionsError)
            }
        }
    }
}

/// An options object with an unknown key or a bad value (serde names which).
#[derive(Debug, thiserror::Error)]
#[error("model_options: {0}")]
pub struct OptionsError(serde_json::Error);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::AdapterMode;

    fn parse(json: &str) -> Result<RequestOptions, OptionsError> {
        RequestOptions::from_json(Some(serde_json::from_str(json).unwrap()))
    }

    #[test]
    fn adapter_and_input_ids_parse_and_unknown_keys_are_refused() {
        assert_eq!(
            RequestOptions::from_json(None).unwrap(),
            RequestOptions::default()
        );
        let o = parse(r#"{"adapter": "speech", "input_ids": [1, 2, 3]}"#).unwrap();
        assert_eq!(o.adapter, AdapterChoice::Fixed(AdapterMode::Speech));
        assert_eq!(o.input_ids, Some(vec![1, 2, 3]));
        assert_eq!(parse("{}").unwrap().adapter, AdapterChoice::Auto);
        let e = parse(r#"{"adaptor": "speech"}"#).unwrap_err().to_string();
        assert!(e.contains("adaptor"), "{e}");
        let e = parse(r#"{"adapter": "audio"}"#).unwrap_err().to_string();
        assert!(e.contains("audio"), "{e}");
        assert!(parse(r#"{"input_ids": [-1]}"#).is_err());
        assert!(parse(r#"{"input_ids": "1 2"}"#).is_err());
    }
}
