//! The raw bytes of one token, for log-probability reports. A byte-level BPE vocabulary spells
//! bytes with GPT-2's printable alphabet, and one token may hold part of a UTF-8 character, so
//! decoding a lone id to text (which replaces broken characters) would lose them.

use std::collections::HashMap;
use std::sync::OnceLock;

use tokenizers::{DecoderWrapper, Model, Tokenizer};

/// GPT-2's `bytes_to_unicode`, inverted: the 188 printable bytes stand for themselves, the other
/// 68 are spelled U+0100, U+0101, … in byte order.
fn byte_of(c: char) -> Option<u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 0x100u32;
        (0..=255u8)
            .map(|b| {
                if printable(b) {
                    (char::from(b), b)
                } else {
                    next += 1;
                    (char::from_u32(next - 1).expect("below U+0200"), b)
                }
            })
            .collect()
    });
    table.get(&c).copied()
}

/// The bytes token `id` stands for: added (special) tokens as written, byte-level vocabulary
/// tokens through the byte alphabet, any other vocabulary by its decoder. Ids without a token
/// (unused rows of the embedding) have no bytes.
pub fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    if let Some(added) = tokenizer.get_added_vocabulary().simple_id_to_token(id) {
        return added.into_bytes();
    }
    let Some(token) = tokenizer.get_model().id_to_token(id) else {
        return Vec::new();
    };
    match tokenizer.get_decoder() {
        Some(DecoderWrapper::ByteLevel(_)) => token
            .chars()
            .flat_map(|c| match byte_of(c) {
                Some(b) => vec![b],
                None => c.to_string().into_bytes(),
            })
            .collect(),
        _ => tokenizer
            .decode(&[id], false)
            .unwrap_or_default()
            .into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_alphabet_is_a_bijection_with_gpt2s_known_points() {
        let mut seen = std::collections::HashSet::new();
        for c in (0x21u32..0x200).filter_map(char::from_u32) {
            if let Some(b) = byte_of(c) {
                assert!(seen.insert(b), "byte {b} spelled twice");
            }
        }
        assert_eq!(seen.len(), 256);
        // GPT-2's well-known spellings: space is 'Ġ' (U+0120), newline 'Ċ' (U+010A).
        assert_eq!(byte_of('Ġ'), Some(b' '));
        assert_eq!(byte_of('Ċ'), Some(b'\n'));
        assert_eq!(byte_of('a'), Some(b'a'));
        assert_eq!(byte_of('\u{0100}'), Some(0));
    }
}
