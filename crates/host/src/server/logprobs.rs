//! OpenAI's `logprobs` objects, from the log probabilities a plugin reports with each token.

use serde_json::{json, Value};
use switchyard_plugin_api::{TokenLogprob, TokenLogprobs};

/// What OpenAI sends for a probability that underflowed to zero (JSON has no -inf).
const NEG_INF_LOGPROB: f32 = -9999.0;

/// How one request wants its `logprobs` written.
#[derive(Clone, Copy, Debug)]
pub struct LogprobsFormat {
    /// `token` reads `token_id:<id>` (vLLM's `return_tokens_as_token_ids`) instead of the
    /// token's bytes as (lossy) UTF-8.
    pub token_ids: bool,
}

impl LogprobsFormat {
    /// One element of `logprobs.content`.
    pub fn entry(&self, logprobs: &TokenLogprobs) -> Value {
        let mut entry = self.token(&logprobs.sampled);
        entry["top_logprobs"] = logprobs.top.iter().map(|t| self.token(t)).collect();
        entry
    }

    /// The legacy completions' `logprobs` object (`tokens`, `token_logprobs`, `top_logprobs`,
    /// `text_offset`) over `tokens`, each with its character offset in the completion text.
    /// `top_logprobs` maps each alternative's text to its log probability; of two alternatives
    /// that read the same, the more likely one is kept.
    pub fn legacy<'a>(
        &self,
        tokens: impl IntoIterator<Item = (usize, &'a TokenLogprobs)>,
    ) -> Value {
        let (mut texts, mut logprobs, mut tops, mut offsets) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (offset, l) in tokens {
            texts.push(self.text(&l.sampled));
            logprobs.push(logprob(&l.sampled));
            let mut top = serde_json::Map::new();
            for t in l.top.iter() {
                top.entry(self.text(t)).or_insert_with(|| logprob(t).into());
            }
            tops.push(Value::Object(top));
            offsets.push(offset);
        }
        json!({"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops,
               "text_offset": offsets})
    }

    fn token(&self, t: &TokenLogprob) -> Value {
        json!({"token": self.text(t), "logprob": logprob(t), "bytes": t.bytes.as_slice()})
    }

    /// How a token reads: `token_id:<id>`, or its bytes as (lossy) UTF-8.
    fn text(&self, t: &TokenLogprob) -> String {
        if self.token_ids {
            format!("token_id:{}", t.id)
        } else {
            String::from_utf8_lossy(&t.bytes).into_owned()
        }
    }
}

/// A log probability JSON can carry.
fn logprob(t: &TokenLogprob) -> f32 {
    if t.logprob.is_finite() {
        t.logprob
    } else {
        NEG_INF_LOGPROB
    }
}

/// The choice's `logprobs` object.
pub fn content(entries: Vec<Value>) -> Value {
    json!({ "content": entries })
}

/// The characters a token's bytes begin: its UTF-8 lead and single-byte characters (a byte-level
/// token may hold the tail of a character begun by the token before it).
pub fn chars_begun(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(id: u32, bytes: &[u8], logprob: f32) -> TokenLogprob {
        TokenLogprob {
            id,
            bytes: bytes.to_vec().into(),
            logprob,
        }
    }

    #[test]
    fn entries_have_openai_fields_and_ids_on_request() {
        let l = TokenLogprobs {
            sampled: lp(7, b"hi", -0.25),
            top: vec![lp(7, b"hi", -0.25), lp(9, &[0xE2, 0x82], f32::NEG_INFINITY)].into(),
        };
        let text = LogprobsFormat { token_ids: false }.entry(&l);
        assert_eq!(text["token"], "hi");
        assert_eq!(text["logprob"], -0.25);
        assert_eq!(text["bytes"], json!([104, 105]));
        assert_eq!(text["top_logprobs"][1]["token"], "\u{FFFD}");
        assert_eq!(text["top_logprobs"][1]["logprob"], -9999.0);
        assert_eq!(text["top_logprobs"][1]["bytes"], json!([0xE2, 0x82]));
        let ids = LogprobsFormat { token_ids: true }.entry(&l);
        assert_eq!(ids["token"], "token_id:7");
        assert_eq!(ids["top_logprobs"][1]["token"], "token_id:9");
    }

    #[test]
    fn legacy_objects_list_tokens_offsets_and_alternatives_by_text() {
        let first = TokenLogprobs {
            sampled: lp(7, b"hi", -0.25),
            top: vec![lp(7, b"hi", -0.25), lp(8, b"ho", -2.0), lp(9, b"hi", -3.0)].into(),
        };
        let second = TokenLogprobs {
            sampled: lp(4, b" x", f32::NEG_INFINITY),
            top: Vec::new().into(),
        };
        let legacy = LogprobsFormat { token_ids: false }.legacy([(0, &first), (2, &second)]);
        assert_eq!(legacy["tokens"], json!(["hi", " x"]));
        assert_eq!(legacy["token_logprobs"], json!([-0.25, -9999.0]));
        assert_eq!(
            legacy["top_logprobs"],
            json!([{"hi": -0.25, "ho": -2.0}, {}])
        );
        assert_eq!(legacy["text_offset"], json!([0, 2]));
        let ids = LogprobsFormat { token_ids: true }.legacy([(0, &first)]);
        assert_eq!(ids["tokens"], json!(["token_id:7"]));
        assert_eq!(
            ids["top_logprobs"],
            json!([{"token_id:7": -0.25, "token_id:8": -2.0, "token_id:9": -3.0}])
        );
    }
}
