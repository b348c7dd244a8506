//! A check of a clip's metadata lengths before symphonia reads them. symphonia 0.5 sizes the
//! buffers of a FLAC PICTURE block (media type, description, data) and of Vorbis comments (FLAC
//! VORBIS_COMMENT blocks, the Ogg Vorbis comment header) from the 32-bit lengths in the file,
//! before reading: a 47-byte clip found by the `audio` fuzz target asked for a 4 GiB allocation,
//! which aborts the process where memory is not overcommitted. The whole clip is in memory, so
//! no length may exceed the bytes that hold it.

use super::error::AudioError;

/// Refuses a FLAC stream (from the first `fLaC` marker, where symphonia's probe starts it)
/// whose metadata blocks state lengths past their block or past the clip, and an Ogg stream
/// (from the first `OggS` page) whose Vorbis comment header states lengths past the packet.
pub(crate) fn check(bytes: &[u8]) -> Result<(), AudioError> {
    check_flac(bytes)?;
    check_ogg_vorbis(bytes)
}

fn check_flac(bytes: &[u8]) -> Result<(), AudioError> {
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

/// The Ogg pages from the first `OggS`, as the packets of the first page's stream: each packet
/// is its segments' bytes joined across pages (a segment shorter than 255 bytes ends it). Stops
/// after `want` packets, at a truncated page, or at the end of the clip.
fn ogg_packets(bytes: &[u8], want: usize) -> Vec<Vec<u8>> {
    let mut packets = Vec::new();
    let Some(mut at) = bytes.windows(4).position(|w| w == b"OggS") else {
        return packets;
    };
    let mut serial = None;
    let mut current = Vec::new();
    while packets.len() < want {
        let Some(header) = bytes.get(at..at + 27).filter(|h| &h[..4] == b"OggS") else {
            break;
        };
        let page_serial = u32::from_le_bytes(header[14..18].try_into().unwrap());
        let segments = header[26] as usize;
        let Some(table) = bytes.get(at + 27..at + 27 + segments) else {
            break;
        };
        let mut data = at + 27 + segments;
        let mine = *serial.get_or_insert(page_serial) == page_serial;
        for &len in table {
            let Some(segment) = bytes.get(data..data + len as usize) else {
                return packets;
            };
            data += len as usize;
            if mine {
                current.extend_from_slice(segment);
                if len < 255 {
                    packets.push(std::mem::take(&mut current));
                    if packets.len() == want {
                        break;
                    }
                }
            }
        }
        at = data;
    }
    packets
}

/// The Vorbis comment header (the second packet: `\x03vorbis`, vendor, comments), whose
/// lengths must fit the packet.
fn check_ogg_vorbis(bytes: &[u8]) -> Result<(), AudioError> {
    let packets = ogg_packets(bytes, 2);
    let Some(comment) = packets.get(1) else {
        return Ok(());
    };
    let Some(body) = comment.strip_prefix(b"\x03vorbis") else {
        return Ok(());
    };
    check_comments(body).map_err(|e| {
        AudioError::Decode(
            e.to_string()
                .replace("malformed FLAC", "malformed Vorbis comment header"),
        )
    })
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

    /// One Ogg page of stream 7 holding `packets` (each under 255 bytes).
    fn ogg_page(packets: &[&[u8]]) -> Vec<u8> {
        let mut v = b"OggS\0\x02".to_vec();
        v.extend_from_slice(&[0; 8]); // granule
        v.extend_from_slice(&7u32.to_le_bytes());
        v.extend_from_slice(&[0; 8]); // sequence, crc
        v.push(packets.len() as u8);
        v.extend(packets.iter().map(|p| p.len() as u8));
        for p in packets {
            v.extend_from_slice(p);
        }
        v
    }

    #[test]
    fn an_ogg_vorbis_comment_bomb_is_refused_and_a_good_header_passes() {
        let mut bomb = b"\x03vorbis".to_vec();
        bomb.extend_from_slice(&0u32.to_le_bytes());
        bomb.extend_from_slice(&1u32.to_le_bytes());
        bomb.extend_from_slice(&0xffff_0000u32.to_le_bytes());
        let clip = ogg_page(&[b"\x01vorbis-ident", &bomb]);
        let err = check(&clip).unwrap_err().to_string();
        assert!(err.contains("malformed Vorbis comment header"), "{err}");
        let mut good = b"\x03vorbis".to_vec();
        good.extend_from_slice(&2u32.to_le_bytes());
        good.extend_from_slice(b"me");
        good.extend_from_slice(&1u32.to_le_bytes());
        good.extend_from_slice(&3u32.to_le_bytes());
        good.extend_from_slice(b"A=b");
        good.push(1); // framing bit
        assert!(check(&ogg_page(&[b"\x01vorbis-ident", &good])).is_ok());
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
