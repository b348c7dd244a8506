//! A check of a clip's metadata lengths before symphonia reads them. symphonia 0.5 sizes some
//! buffers from 32-bit lengths in the file before reading them: a FLAC PICTURE block (media
//! type, description, data), Vorbis comments (FLAC VORBIS_COMMENT blocks, the Ogg Vorbis comment
//! header) and ID3v2 frames (an MP3's tags; a version 2.3 frame states its size in 32 bits). A
//! 47-byte clip found by the `audio` fuzz target asked for a 4 GiB allocation, which aborts the
//! process where memory is not overcommitted. The whole clip is in memory, so no length may
//! exceed the bytes that hold it.
//!
//! The Vorbis setup header is the other amplifier: symphonia's decoder allocates and fills each
//! codebook's tables (code lengths and values per entry, a lookup table of entries × dimensions
//! floats) before it checks the codebook, and a length-ordered codebook states 16 million
//! entries in 53 bits: a 200-byte Ogg clip made it allocate and write 2 GB. The codebooks'
//! entries and lookup values are bounded here, far above what encoders write.
//!
//! WAV goes through `hound`, which skips unknown chunks in 1 KiB reads and allocates nothing
//! from a chunk size; the data chunk's size is checked against the clip in `decode.rs`. Ogg pages
//! are at most 255 segments of 255 bytes, and symphonia joins a packet only from bytes it read.

use super::error::AudioError;

/// Refuses a FLAC stream (from the first `fLaC` marker, where symphonia's probe starts it)
/// whose metadata blocks state lengths past their block or past the clip, an Ogg stream (from
/// the first `OggS` page) whose Vorbis comment header states lengths past the packet, and ID3v2
/// tags whose frames state sizes past their tag.
pub(crate) fn check(bytes: &[u8]) -> Result<(), AudioError> {
    check_flac(bytes)?;
    check_ogg_vorbis(bytes)?;
    check_id3v2(bytes)
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
/// lengths must fit the packet, and the setup header (the third), whose codebooks are bounded.
fn check_ogg_vorbis(bytes: &[u8]) -> Result<(), AudioError> {
    let packets = ogg_packets(bytes, 3);
    if let Some(body) = packets.get(1).and_then(|p| p.strip_prefix(b"\x03vorbis")) {
        check_comments(body).map_err(|e| {
            AudioError::Decode(
                e.to_string()
                    .replace("malformed FLAC", "malformed Vorbis comment header"),
            )
        })?;
    }
    match packets.get(2).and_then(|p| p.strip_prefix(b"\x05vorbis")) {
        Some(body) => check_vorbis_codebooks(body),
        None => Ok(()),
    }
}

/// Codebook entries of one Vorbis setup header, all codebooks together. libvorbis' largest
/// codebooks have a few thousand entries, and a setup header holds at most 256 codebooks.
const MAX_VORBIS_CODEBOOK_ENTRIES: u64 = 1 << 20;
/// Lookup-table values (entries × dimensions of each codebook with a lookup table) of one
/// Vorbis setup header, all codebooks together: 16 MB as f32.
const MAX_VORBIS_LOOKUP_VALUES: u64 = 1 << 22;

/// An LSB-first bit reader, as Vorbis packs its headers; `None` past the end.
struct Bits<'a> {
    bytes: &'a [u8],
    at: u64,
}

impl Bits<'_> {
    fn read(&mut self, n: u32) -> Option<u32> {
        let mut value = 0u32;
        for i in 0..u64::from(n) {
            let bit = self.at + i;
            let byte = *self.bytes.get(usize::try_from(bit / 8).ok()?)?;
            value |= u32::from((byte >> (bit % 8)) & 1) << i;
        }
        self.at += u64::from(n);
        Some(value)
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        self.at = self.at.checked_add(n)?;
        (self.at <= 8 * self.bytes.len() as u64).then_some(())
    }
}

/// `⌊entries^(1/dimensions)⌋` as symphonia computes it (in f32), to skip the same bits.
fn lookup1_values(entries: u32, dimensions: u16) -> u64 {
    (entries as f32).powf(1.0 / f32::from(dimensions)).floor() as u64
}

/// Walks the codebooks of a setup header (after `\x05vorbis`) as symphonia reads them and
/// refuses the header once their entries or lookup values pass the bounds, before symphonia
/// would allocate for them. Where the walk cannot go on, symphonia refuses the header itself.
fn check_vorbis_codebooks(body: &[u8]) -> Result<(), AudioError> {
    let mut bits = Bits { bytes: body, at: 0 };
    let Some(count) = bits.read(8) else {
        return Ok(());
    };
    let (mut entries_total, mut values_total) = (0u64, 0u64);
    for _ in 0..=count {
        let (Some(0x56_4342), Some(dimensions), Some(entries)) =
            (bits.read(24), bits.read(16), bits.read(24))
        else {
            return Ok(());
        };
        entries_total += u64::from(entries);
        if entries_total > MAX_VORBIS_CODEBOOK_ENTRIES {
            return Err(AudioError::Decode(format!(
                "malformed Vorbis setup header: its codebooks state {entries_total} entries \
                 or more, over the bound of {MAX_VORBIS_CODEBOOK_ENTRIES}"
            )));
        }
        if skip_code_lengths(&mut bits, entries).is_none() {
            return Ok(());
        }
        let Some(lookup_type) = bits.read(4) else {
            return Ok(());
        };
        if lookup_type == 0 {
            continue;
        }
        if lookup_type > 2 {
            return Ok(());
        }
        values_total += u64::from(entries) * u64::from(dimensions);
        if values_total > MAX_VORBIS_LOOKUP_VALUES {
            return Err(AudioError::Decode(format!(
                "malformed Vorbis setup header: its codebooks' lookup tables hold \
                 {values_total} values or more, over the bound of {MAX_VORBIS_LOOKUP_VALUES}"
            )));
        }
        // Minimum and delta, the value width, the sequence flag; then the multiplicands.
        let (Some(_), Some(_), Some(width), Some(_)) =
            (bits.read(32), bits.read(32), bits.read(4), bits.read(1))
        else {
            return Ok(());
        };
        let values = match lookup_type {
            1 if dimensions > 0 => lookup1_values(entries, dimensions as u16),
            1 => return Ok(()),
            _ => u64::from(entries) * u64::from(dimensions),
        };
        if bits.skip(values * u64::from(width + 1)).is_none() {
            return Ok(());
        }
    }
    Ok(())
}

/// Skips one codebook's code lengths (dense, sparse or length-ordered); `None` where the
/// header ends or is malformed.
fn skip_code_lengths(bits: &mut Bits<'_>, entries: u32) -> Option<()> {
    if bits.read(1)? == 0 {
        let sparse = bits.read(1)? == 1;
        if !sparse {
            return bits.skip(u64::from(entries) * 5);
        }
        for _ in 0..entries {
            if bits.read(1)? == 1 {
                bits.read(5)?;
            }
        }
        return Some(());
    }
    bits.read(5)?;
    let mut entry = 0u32;
    while entry < entries {
        let width = 32 - (entries - entry).leading_zeros();
        entry = entry.checked_add(bits.read(width)?)?;
    }
    (entry == entries).then_some(())
}

/// The start-of-stream markers symphonia's probe looks for, with the features this crate enables
/// (the MP3 frame syncs, FLAC, Ogg, and the ID3v2 tag it reads as metadata before the stream).
const PROBE_MARKERS: [&[u8]; 9] = [
    b"ID3",
    b"fLaC",
    b"OggS",
    &[0xff, 0xfa],
    &[0xff, 0xfb],
    &[0xff, 0xf2],
    &[0xff, 0xf3],
    &[0xff, 0xe2],
    &[0xff, 0xe3],
];

/// How far symphonia's probe scans for a marker before it gives up (`Probe::PROBE_SEARCH_LIMIT`).
const PROBE_SEARCH_LIMIT: usize = 1 << 20;

/// Where the probe, scanning from `from`, finds its next marker.
fn next_marker(bytes: &[u8], from: usize) -> Option<(usize, &'static [u8])> {
    let end = bytes.len().min(from.saturating_add(PROBE_SEARCH_LIMIT));
    (from..end).find_map(|at| {
        PROBE_MARKERS
            .iter()
            .find(|m| bytes[at..].starts_with(m))
            .map(|m| (at, *m))
    })
}

fn id3_malformed(why: String) -> AudioError {
    AudioError::Decode(format!("malformed ID3v2 tag: {why}"))
}

/// A 28-bit ID3v2 "syncsafe" integer: 7 bits per byte, as symphonia reads it.
fn syncsafe(b: &[u8]) -> usize {
    b.iter().fold(0, |n, &x| (n << 7) | usize::from(x & 0x7f))
}

/// Each ID3v2 tag the probe would read (it reads a tag wherever the tag is the first marker it
/// finds, then probes on after it): the tag must fit in the clip and each of its frames in the
/// tag, since symphonia allocates a frame's stated size before it reads the frame.
fn check_id3v2(bytes: &[u8]) -> Result<(), AudioError> {
    let mut from = 0;
    while let Some((at, marker)) = next_marker(bytes, from) {
        if marker != b"ID3" {
            return Ok(());
        }
        let Some(header) = bytes.get(at..at + 10) else {
            return Ok(());
        };
        let (major, flags) = (header[3], header[5]);
        if !(2..=4).contains(&major) {
            return Ok(()); // symphonia refuses the tag itself
        }
        let size = syncsafe(&header[6..10]);
        let body = bytes.get(at + 10..at + 10 + size).ok_or_else(|| {
            id3_malformed(format!(
                "{size} bytes, {} left in the clip",
                bytes.len() - at - 10
            ))
        })?;
        // Before version 4 an unsynchronised tag is read through symphonia's unsync decoder,
        // and frame sizes count the decoded bytes.
        let decoded;
        let body = if flags & 0x80 != 0 && major < 4 {
            decoded = resynchronise(body);
            &decoded[..]
        } else {
            body
        };
        check_id3v2_frames(body, major, flags & 0x40 != 0)?;
        from = at + 10 + size;
    }
    Ok(())
}

/// Undoes ID3v2 unsynchronisation: every `FF 00` becomes `FF`.
fn resynchronise(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        let stuffed = b == 0 && i > 0 && bytes[i - 1] == 0xff;
        if !stuffed {
            out.push(b);
        }
    }
    out
}

/// Walks a tag's frames as symphonia does: past the extended header (read field by field as
/// symphonia reads it), then frame after frame until padding or too few bytes for a header.
fn check_id3v2_frames(tag: &[u8], major: u8, extended: bool) -> Result<(), AudioError> {
    let mut rest = tag;
    if extended && major >= 3 {
        let Some(skip) = extended_header_len(rest, major) else {
            return Ok(()); // symphonia refuses the tag there
        };
        rest = rest.get(skip..).unwrap_or_default();
    }
    let (id_len, header_len) = if major == 2 { (3, 6) } else { (4, 10) };
    loop {
        let Some(header) = rest.get(..header_len) else {
            return Ok(());
        };
        let id = &header[..id_len];
        if !id
            .iter()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        {
            return Ok(()); // padding: symphonia stops here
        }
        let size = match major {
            2 => u32::from_be_bytes([0, header[3], header[4], header[5]]) as usize,
            3 => u32::from_be_bytes(header[4..8].try_into().expect("4 bytes")) as usize,
            _ => syncsafe(&header[4..8]),
        };
        let left = rest.len() - header_len;
        if size > left {
            return Err(id3_malformed(format!(
                "frame {} of {size} bytes, {left} left in the tag",
                String::from_utf8_lossy(id)
            )));
        }
        rest = &rest[header_len + size..];
    }
}

/// The bytes symphonia reads of an extended header, or `None` where it refuses the header.
fn extended_header_len(tag: &[u8], major: u8) -> Option<usize> {
    if major == 3 {
        // Size (6 or 10), flags, padding size; a CRC when the size is 10 and the flag is set.
        let size = u32::from_be_bytes(tag.get(..4)?.try_into().ok()?);
        let crc = size == 10 && tag.get(4)? & 0x80 != 0;
        return matches!(size, 6 | 10).then_some(10 + if crc { 4 } else { 0 });
    }
    // Size, a flag-byte count of 1, the flags; then per flag a length byte and its data.
    if *tag.get(4)? != 1 {
        return None;
    }
    let flags = *tag.get(5)?;
    let mut len = 6;
    for (bit, data) in [(0x40, 0), (0x20, 5), (0x10, 1)] {
        if flags & bit != 0 {
            len += 1 + data;
        }
    }
    Some(len)
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

    /// An ID3v2 tag of `major` version holding one frame `id` that states `size` but holds
    /// `held` bytes, then an MP3 frame sync.
    fn id3(major: u8, flags: u8, id: &[u8], size: u32, held: usize) -> Vec<u8> {
        let mut frame = id.to_vec();
        match major {
            2 => frame.extend_from_slice(&size.to_be_bytes()[1..]),
            3 => frame.extend_from_slice(&size.to_be_bytes()),
            _ => frame.extend((0..4).rev().map(|k| ((size >> (7 * k)) & 0x7f) as u8)),
        }
        if major > 2 {
            frame.extend_from_slice(&[0, 0]);
        }
        frame.resize(frame.len() + held, b'a');
        let len = frame.len() as u32;
        let mut v = vec![b'I', b'D', b'3', major, 0, flags];
        v.extend((0..4).rev().map(|k| ((len >> (7 * k)) & 0x7f) as u8));
        v.extend(frame);
        v.extend_from_slice(&[0xff, 0xfb, 0x90, 0x00]);
        v
    }

    #[test]
    fn id3v2_frames_stating_more_than_their_tag_are_refused() {
        // Version 2.3 sizes are 32-bit: symphonia would allocate 4 GiB for this title.
        for (major, id, size) in [
            (3, &b"TIT2"[..], 0xffff_fff0),
            (4, &b"APIC"[..], 0x0fff_ffff),
            (2, &b"TT2"[..], 0x00ff_ffff),
        ] {
            let err = check(&id3(major, 0, id, size, 8)).unwrap_err().to_string();
            assert!(err.contains("malformed ID3v2 tag: frame"), "{err}");
            // Stating what it holds, the same frame passes.
            assert!(check(&id3(major, 0, id, 8, 8)).is_ok(), "v2.{major}");
        }
    }

    #[test]
    fn an_id3v2_tag_past_the_clip_or_behind_junk_is_checked() {
        let mut long = id3(3, 0, b"TIT2", 8, 8);
        long[9] = 0x7f; // the tag claims 127 more bytes than the clip has
        let err = check(&long).unwrap_err().to_string();
        assert!(err.contains("left in the clip"), "{err}");
        // The probe skips junk before its first marker, and reads a second tag after the first.
        let mut hidden = b"junk".to_vec();
        hidden.extend(id3(3, 0, b"TIT2", 0xffff_fff0, 8));
        assert!(check(&hidden).is_err());
        let mut second = id3(3, 0, b"TIT2", 8, 8);
        second.truncate(second.len() - 4);
        second.extend(id3(3, 0, b"TIT2", 0xffff_fff0, 8));
        assert!(check(&second).is_err());
        // "ID3" inside audio the probe already reads as MP3 is not a tag.
        let mut inside = vec![0xff, 0xfb, 0x90, 0x00];
        inside.extend(id3(3, 0, b"TIT2", 0xffff_fff0, 8));
        assert!(check(&inside).is_ok());
    }

    #[test]
    fn id3v2_extended_headers_and_unsynchronisation_are_read_as_symphonia_reads_them() {
        // Version 2.3, extended header of size 6 (10 bytes read), then a lying frame.
        let mut tag = vec![b'I', b'D', b'3', 3, 0, 0x40];
        let mut body = vec![0, 0, 0, 6, 0, 0, 0, 0, 0, 0];
        body.extend_from_slice(b"TIT2");
        body.extend_from_slice(&0xffff_fff0u32.to_be_bytes());
        body.extend_from_slice(&[0, 0, b'a']);
        tag.extend(
            (0..4)
                .rev()
                .map(|k| ((body.len() as u32 >> (7 * k)) & 0x7f) as u8),
        );
        tag.extend(body);
        assert!(check(&tag).is_err());
        // Unsynchronised version 2.3: `FF 00` is one byte, so a frame of 2 bytes holding
        // `FF 00 FF 00` fits; stating 3 it does not.
        for (size, ok) in [(2u32, true), (3, false)] {
            let mut body = b"TIT2".to_vec();
            body.extend_from_slice(&size.to_be_bytes());
            body.extend_from_slice(&[0, 0, 0xff, 0x00, 0xff, 0x00]);
            let mut tag = vec![b'I', b'D', b'3', 3, 0, 0x80];
            tag.extend(
                (0..4)
                    .rev()
                    .map(|k| ((body.len() as u32 >> (7 * k)) & 0x7f) as u8),
            );
            tag.extend(body);
            assert_eq!(check(&tag).is_ok(), ok, "size {size}");
        }
    }

    /// An LSB-first bit writer, as Vorbis packs its headers.
    #[derive(Default)]
    struct BitWriter {
        bytes: Vec<u8>,
        bits: usize,
    }

    impl BitWriter {
        fn put(&mut self, value: u32, n: u32) -> &mut Self {
            for i in 0..n {
                if self.bits.is_multiple_of(8) {
                    self.bytes.push(0);
                }
                let bit = ((value >> i) & 1) as u8;
                *self.bytes.last_mut().unwrap() |= bit << (self.bits % 8);
                self.bits += 1;
            }
            self
        }
    }

    /// A setup header of one codebook of `entries` × `dimensions`, length-ordered (all entries
    /// one length), with a type-1 lookup table of one multiplicand.
    fn setup(entries: u32, dimensions: u32) -> Vec<u8> {
        let mut w = BitWriter::default();
        w.put(0, 8)
            .put(0x56_4342, 24)
            .put(dimensions, 16)
            .put(entries, 24);
        w.put(1, 1)
            .put(0, 5)
            .put(entries, 32 - entries.leading_zeros());
        w.put(1, 4).put(0, 32).put(0, 32).put(0, 4).put(0, 1);
        let values = lookup1_values(entries, dimensions as u16);
        w.put(0, values as u32);
        let mut packet = b"\x05vorbis".to_vec();
        packet.extend(w.bytes);
        packet
    }

    #[test]
    fn vorbis_codebooks_stating_huge_tables_are_refused() {
        // 16.7 million entries of 31 dimensions in a 27-byte header: symphonia would write a
        // 2 GB lookup table.
        let bomb = setup(0xff_ffff, 31);
        assert!(bomb.len() < 40, "{} bytes", bomb.len());
        let clip = ogg_page(&[
            b"\x01vorbis-ident",
            b"\x03vorbis\0\0\0\0\0\0\0\0\x01",
            &bomb,
        ]);
        let err = check(&clip).unwrap_err().to_string();
        assert!(err.contains("malformed Vorbis setup header"), "{err}");
        assert!(err.contains("entries"), "{err}");
        // Few entries, many dimensions: the lookup table is the amplifier.
        let err = check_vorbis_codebooks(&setup(200_000, 31)[7..])
            .unwrap_err()
            .to_string();
        assert!(err.contains("lookup tables hold 6200000 values"), "{err}");
        // A codebook of an encoder's size passes, and so does a header the walk cannot finish.
        assert!(check_vorbis_codebooks(&setup(625, 4)[7..]).is_ok());
        assert!(check_vorbis_codebooks(&[0x00, 0x42, 0x43]).is_ok());
    }
}
