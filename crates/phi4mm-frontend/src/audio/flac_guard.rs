//! A check of a FLAC stream's metadata blocks before symphonia reads them. symphonia 0.5 sizes
//! the buffers of a PICTURE block (media type, description, data) and of VORBIS_COMMENT entries
//! from the 32-bit lengths in the file, before reading: a 47-byte clip found by the `audio` fuzz
//! target asked for a 4 GiB allocation, which aborts the process where memory is not
//! overcommitted. The whole clip is in memory, so no length may exceed the bytes that follow it.

use super::error::AudioError;

/// Refuses a FLAC stream (the first `fLaC` marker, where symphonia's probe starts it) whose
/// metadata blocks state lengths past their block or past the clip.
pub(crate) fn check(bytes: &[u8]) -> Result<(), AudioError> {
    let Some(start) = bytes.windows(4).position(|w| w == b"fLaC") else {
        return Ok(());
    };
    let mut rest = &bytes[start + 4..];
    while rest.len() >= 4 {
        let last = rest[0] & 0x80 != 0;
        let kind = rest[0] & 0x7f;
        let len = u32::from_be_bytes([0, rest[1], rest[2], rest[3]]) as usize;
        let body = rest.get(4..4 + len).ok_or_else(|| {
            malformed(format!(
                "metadata block of {len} bytes, {} left",
                rest.len() - 4
            ))
        })?;
        match kind {
            4 => check_comments(body)?,
            6 => check_picture(body)?,
            _ => {}
        }
        if last {
            break;
        }
        rest = &rest[4 + len..];
    }
    Ok(())
}

fn malformed(why: String) -> AudioError {
    AudioError::Decode(format!("malformed FLAC: {why}"))
}

/// A reader of length-prefixed fields that refuses any length past the block.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u32(&mut self, big_endian: bool, what: &str) -> Result<usize, AudioError> {
        let b: [u8; 4] = self
            .0
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| malformed(format!("{what}: block ends early")))?;
        self.0 = &self.0[4..];
        Ok(if big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        } as usize)
    }

    fn skip(&mut self, len: usize, what: &str) -> Result<(), AudioError> {
        if len > self.0.len() {
            return Err(malformed(format!(
                "{what} of {len} bytes in a block with {} left",
                self.0.len()
            )));
        }
        self.0 = &self.0[len..];
        Ok(())
    }
}

/// PICTURE: type, media type (length + bytes), description (length + bytes), four u32s, data
/// (length + bytes); big-endian.
fn check_picture(body: &[u8]) -> Result<(), AudioError> {
    let mut f = Fields(body);
    f.u32(true, "picture type")?;
    let n = f.u32(true, "picture media type length")?;
    f.skip(n, "picture media type")?;
    let n = f.u32(true, "picture description length")?;
    f.skip(n, "picture description")?;
    for what in [
        "picture width",
        "picture height",
        "picture depth",
        "picture colours",
    ] {
        f.u32(true, what)?;
    }
    let n = f.u32(true, "picture data length")?;
    f.skip(n, "picture data")
}

/// VORBIS_COMMENT: vendor (length + bytes), a count, then each comment (length + bytes);
/// little-endian.
fn check_comments(body: &[u8]) -> Result<(), AudioError> {
    let mut f = Fields(body);
    let n = f.u32(false, "vendor length")?;
    f.skip(n, "vendor string")?;
    let count = f.u32(false, "comment count")?;
    for _ in 0..count {
        let n = f.u32(false, "comment length")?;
        f.skip(n, "comment")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fLaC` then one last-flagged block of `kind` holding `body`.
    fn flac(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = b"fLaC".to_vec();
        let len = body.len() as u32;
        v.push(0x80 | kind);
        v.extend_from_slice(&len.to_be_bytes()[1..]);
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn the_fuzzer_found_picture_bomb_is_refused() {
        // The 47-byte `audio` fuzz artifact: a RIFF-looking prefix, then a FLAC stream whose
        // PICTURE block states a ~4 GiB media type.
        let bomb: [u8; 47] = [
            0x52, 0x49, 0x46, 0x46, 0xa4, 0x0c, 0x00, 0x57, 0x00, 0x41, 0x56, 0x45, 0x66, 0x6d,
            0x70, 0x20, 0x10, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x80, 0x00, 0x00, 0x01, 0x3e,
            0x00, 0x00, 0x66, 0x4c, 0x61, 0x43, 0x06, 0x00, 0x10, 0xc3, 0x2a, 0xc2, 0x6b, 0xc1,
            0xff, 0xfd, 0xc0, 0xd4, 0xc0,
        ];
        let err = check(&bomb).unwrap_err().to_string();
        assert!(err.contains("malformed FLAC"), "{err}");
    }

    #[test]
    fn picture_and_comment_lengths_must_fit_their_block() {
        let mut picture = 3u32.to_be_bytes().to_vec();
        picture.extend_from_slice(&u32::MAX.to_be_bytes()); // media type length
        assert!(check(&flac(6, &picture)).is_err());
        let mut comments = 0u32.to_le_bytes().to_vec(); // vendor ""
        comments.extend_from_slice(&1u32.to_le_bytes());
        comments.extend_from_slice(&0xffff_fff0u32.to_le_bytes());
        assert!(check(&flac(4, &comments)).is_err());
        assert!(
            check(b"fLaC\x80\xff\xff\xff").is_err(),
            "a block past the clip"
        );
    }

    #[test]
    fn well_formed_blocks_pass() {
        let mut picture = 3u32.to_be_bytes().to_vec();
        for field in [&b"image/png"[..], b"cover"] {
            picture.extend_from_slice(&(field.len() as u32).to_be_bytes());
            picture.extend_from_slice(field);
        }
        for v in [1u32, 1, 24, 0, 2] {
            picture.extend_from_slice(&v.to_be_bytes());
        }
        picture.extend_from_slice(&[0xaa, 0xbb]);
        assert!(check(&flac(6, &picture)).is_ok());
        let mut comments = 3u32.to_le_bytes().to_vec();
        comments.extend_from_slice(b"abc");
        comments.extend_from_slice(&1u32.to_le_bytes());
        comments.extend_from_slice(&5u32.to_le_bytes());
        comments.extend_from_slice(b"A=xyz");
        assert!(check(&flac(4, &comments)).is_ok());
        assert!(check(b"no marker here").is_ok());
    }
}
