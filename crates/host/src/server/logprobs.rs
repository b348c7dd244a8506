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

    fn token(&self, t: &TokenLogprob) -> Value {
        let token = if self.token_ids {
            format!("token_id:{}", t.id)
        } else {
            String::from_utf8_lossy(&t.bytes).into_owned()
        };
        let logprob = if t.logprob.is_finite() {
            t.logprob
        } else {
            NEG_INF_LOGPROB
        };
        json!({"token": token, "logprob": logprob, "bytes": t.bytes.as_slice()})
    }
}

/// The choice's `logprobs` object.
pub fn content(entries: Vec<Value>) -> Value {
    json!({ "content": entries })
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
}
