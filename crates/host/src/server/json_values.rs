//! A bound on how many values a request's JSON may hold, checked before it is parsed.
//!
//! serde builds a node per value: 32 bytes or more for `[]`, which is three bytes of text. A
//! body of nested empty arrays under `model_options` (kept as a `serde_json::Value`) or under any
//! field that serde buffers while it tries an untagged enum's variants or a flattened struct's
//! fields took about 24 times its size: 1.5 GB for one 62 MB body. The bound holds a body's
//! parse to tens of megabytes, far above what a real request holds (a completion's prompt of
//! 131072 token ids is 131072 values; media are single strings).

use super::error::ApiError;
use axum::http::StatusCode;

/// The most JSON values a request body may hold (documented in `docs/operations.md`).
pub const MAX_JSON_VALUES: usize = 1 << 20;

/// Refuses `body` if it holds more than [`MAX_JSON_VALUES`] values.
pub fn check(body: &[u8]) -> Result<(), ApiError> {
    // Two bytes (`0,`) per value at the least: a shorter body cannot hold too many, and the
    // requests of the hot path skip the scan.
    if body.len() / 2 < MAX_JSON_VALUES {
        return Ok(());
    }
    if upper_bound(body, MAX_JSON_VALUES) <= MAX_JSON_VALUES {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "too_many_json_values",
        format!(
            "the JSON body holds more than {MAX_JSON_VALUES} values (arrays' elements and \
             objects' fields), the limit on values per request body"
        ),
    ))
}

/// An upper bound on the number of values in `json`, from its structure: one, plus one per
/// `[` or `{` and one per `,` outside strings. It stops counting once past `stop`. Malformed
/// JSON gets some count; the parser refuses it afterwards.
fn upper_bound(json: &[u8], stop: usize) -> usize {
    let mut count = 1;
    let mut at = 0;
    while at < json.len() && count <= stop {
        match json[at] {
            b'"' => {
                // Skip the string: to its closing quote, past escaped characters.
                at += 1;
                loop {
                    match memchr::memchr2(b'"', b'\\', &json[at..]) {
                        Some(i) if json[at + i] == b'\\' => at += i + 2,
                        Some(i) => {
                            at += i + 1;
                            break;
                        }
                        None => return count,
                    }
                    if at >= json.len() {
                        return count;
                    }
                }
                continue;
            }
            b'[' | b'{' | b',' => count += 1,
            _ => {}
        }
        at += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_outside_strings_only() {
        assert_eq!(upper_bound(br#"{"a":1,"b":[2,3]}"#, usize::MAX), 5);
        assert_eq!(upper_bound(br#"[[],[],[]]"#, usize::MAX), 7);
        // Brackets, commas and escaped quotes inside strings are text.
        assert_eq!(upper_bound(br#"{"a":"[,{\"[,"}"#, usize::MAX), 2);
        assert_eq!(upper_bound(br#"["\\",1]"#, usize::MAX), 3);
        // An unterminated string ends the count.
        assert_eq!(upper_bound(br#"[1,"abc"#, usize::MAX), 3);
    }

    #[test]
    fn a_body_of_empty_arrays_is_refused_naming_the_limit() {
        let n = MAX_JSON_VALUES;
        let bomb = format!(
            r#"{{"model":"m","model_options":{{"a":[{}[]]}}}}"#,
            "[],".repeat(n)
        );
        let err = check(bomb.as_bytes()).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(
            err.message.contains(&MAX_JSON_VALUES.to_string()),
            "{}",
            err.message
        );
        // As long, but its bulk in a string (an image's base64): accepted.
        let media = format!(r#"{{"model":"m","image":"{}"}}"#, "[],".repeat(n));
        assert!(check(media.as_bytes()).is_ok());
        // A completion prompt of 131072 token ids: accepted.
        let ids = vec!["100000"; 131072].join(",");
        assert!(check(format!(r#"{{"prompt":[{ids}]}}"#).as_bytes()).is_ok());
    }
}
