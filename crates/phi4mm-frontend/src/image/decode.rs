//! Bounded image decoding and Pillow-equal alpha compositing.

use super::error::ImageError;
use super::options::ImageOptions;
use image::{DynamicImage, ImageFormat, ImageReader, RgbImage, RgbaImage};
use std::{borrow::Cow, io::Cursor};

/// Decodes PNG/JPEG/WebP/GIF (first frame) into RGB8, compositing transparency onto white.
///
/// The header's dimensions are checked against `max_pixels` before any pixel buffer exists, and
/// the decoder runs under `image::Limits` as a second fence (a lying header cannot make it
/// allocate more than the pixel limit allows).
pub fn decode_rgb(bytes: &[u8], options: &ImageOptions) -> Result<RgbImage, ImageError> {
    let (format, width, height) = header(bytes, options)?;
    if format == ImageFormat::Jpeg && !jpeg_is_complete(bytes) {
        return Err(ImageError::Decode(
            "the JPEG ends before its end-of-image marker (truncated)".into(),
        ));
    }
    let bytes = match format {
        ImageFormat::Png => without_icc_profile(bytes),
        _ => Cow::Borrowed(bytes),
    };
    let mut reader = ImageReader::with_format(Cursor::new(&*bytes), format);
    let mut limits = image::Limits::default();
    // 8 bytes per pixel covers RGBA16 decoding; the conversion to RGB8 below adds 3 more.
    limits.max_alloc = Some(options.max_pixels.saturating_mul(8).max(1 << 20));
    limits.max_image_width = Some(width);
    limits.max_image_height = Some(height);
    reader.limits(limits);
    // A decoder panic on a malformed file becomes an error, as for audio.
    let image = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reader.decode()))
        .map_err(|_| ImageError::Decode("decoder failed on malformed input".into()))?
        .map_err(|e| match e {
            // The header's size passed, so the file holds more than it states (a GIF frame
            // larger than its screen): name the limit that stopped it.
            image::ImageError::Limits(_) => ImageError::Decode(format!(
                "the image holds more than its header states, over what max_image_pixels = {} \
                 allows to decode",
                options.max_pixels
            )),
            e => ImageError::Decode(e.to_string().trim_end().to_owned()),
        })?;
    Ok(to_rgb_on_white(image))
}

/// The image's `(width, height)` from its container header, checked like [`decode_rgb`] checks
/// it before decoding (size, format, pixel limit; the same errors), without decoding a pixel.
pub fn probe(bytes: &[u8], options: &ImageOptions) -> Result<(u32, u32), ImageError> {
    header(bytes, options).map(|(_, w, h)| (w, h))
}

fn header(bytes: &[u8], options: &ImageOptions) -> Result<(ImageFormat, u32, u32), ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    if bytes.len() > options.max_bytes {
        return Err(ImageError::TooManyBytes {
            got: bytes.len(),
            limit: options.max_bytes,
        });
    }
    let format = image::guess_format(bytes).map_err(|_| ImageError::UnsupportedFormat)?;
    if !matches!(
        format,
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif
    ) {
        return Err(ImageError::UnsupportedFormat);
    }
    let (width, height) = match format {
        ImageFormat::Png => png_dimensions(bytes)?,
        ImageFormat::WebP => webp_dimensions(bytes)?,
        _ => ImageReader::with_format(Cursor::new(bytes), format)
            .into_dimensions()
            .map_err(|e| ImageError::Decode(e.to_string()))?,
    };
    check_pixels(width, height, options.max_pixels)?;
    Ok((format, width, height))
}

/// A PNG's dimensions, from its IHDR chunk, which the format puts first. Not through the PNG
/// decoder: it reads every chunk before the image data (inflating an ICC profile, which can be
/// a bomb), and it checks the image's whole buffer against its allocation limit, so a 2^31 × 1
/// header was refused as "Memory limit exceeded" rather than by `max_image_pixels`.
fn png_dimensions(bytes: &[u8]) -> Result<(u32, u32), ImageError> {
    // The 8-byte signature, then the chunk: length (4), type (4), width (4), height (4).
    match bytes.get(12..24) {
        Some(chunk) if &chunk[..4] == b"IHDR" => {
            let be = |at: usize| u32::from_be_bytes(chunk[at..at + 4].try_into().unwrap());
            Ok((be(4), be(8)))
        }
        _ => Err(ImageError::Decode(
            "not a PNG: its first chunk is not IHDR".into(),
        )),
    }
}

/// The PNG without its `iCCP` chunks, if it has any (else as it is). The decoder inflates an
/// ICC profile whole, bounded only by the allocation limit sized for the pixels: QA's 10 × 1
/// PNG of 522 KB held a profile of 512 MiB, and each such request took 540 MB to decode. The
/// profile is never used (the reference, Pillow's `convert("RGB")`, ignores it too). A file
/// whose chunks do not parse is left to the decoder to refuse.
fn without_icc_profile(bytes: &[u8]) -> Cow<'_, [u8]> {
    const SIGNATURE: usize = 8;
    // Each chunk: length (4, big-endian), type (4), data, CRC (4).
    let chunks = || {
        let mut at = SIGNATURE;
        std::iter::from_fn(move || {
            let head = bytes.get(at..at.checked_add(8)?)?;
            let length = u32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
            let end = at.checked_add(12)?.checked_add(length)?;
            let chunk = (&head[4..8], at..end.min(bytes.len()));
            at = end;
            Some(chunk)
        })
    };
    if !chunks().any(|(kind, _)| kind == b"iCCP") {
        return Cow::Borrowed(bytes);
    }
    let mut kept = bytes[..SIGNATURE.min(bytes.len())].to_vec();
    for (kind, span) in chunks() {
        if kind != b"iCCP" {
            kept.extend_from_slice(&bytes[span]);
        }
    }
    Cow::Owned(kept)
}

/// Whether a JPEG reaches its end-of-image marker (FF D9), walked marker by marker from its
/// start: each segment skipped by its length, each scan's coded data up to the next marker (in
/// coded data a byte FF is written FF 00, and the restart markers FF D0–D7 stay inside the
/// scan). The decoder fills what a cut file lacks with grey and says nothing; the reference,
/// Pillow, refuses such a file as truncated. Whatever follows the image (another image, as in
/// MPO, or a motion photo's video) is not looked at.
fn jpeg_is_complete(bytes: &[u8]) -> bool {
    let mut at = 2; // after the start-of-image marker, FF D8
    loop {
        // Fill bytes FF may precede a marker.
        while bytes.get(at) == Some(&0xff) && bytes.get(at + 1) == Some(&0xff) {
            at += 1;
        }
        let (Some(0xff), Some(&marker)) = (bytes.get(at), bytes.get(at + 1)) else {
            return false;
        };
        at += 2;
        match marker {
            0xd9 => return true,
            // Standalone markers: no length.
            0x01 | 0xd0..=0xd7 => continue,
            _ => {}
        }
        let Some(length) = bytes.get(at..at + 2) else {
            return false;
        };
        at += usize::from(u16::from_be_bytes([length[0], length[1]]));
        if marker == 0xda {
            // The scan's coded data runs to the next marker that is not a restart.
            loop {
                let Some(ff) = bytes
                    .get(at..)
                    .and_then(|rest| rest.iter().position(|&b| b == 0xff))
                else {
                    return false;
                };
                at += ff;
                match bytes.get(at + 1) {
                    Some(0x00 | 0xd0..=0xd7) => at += 2,
                    Some(0xff) => at += 1,
                    Some(_) => break,
                    None => return false,
                }
            }
        }
    }
}

/// A WebP's dimensions, from its first chunk (VP8X's canvas, or the frame header of a simple
/// lossy or lossless file). Not through the decoder, which refuses a canvas over its own bound
/// as "Image too large" before our limit could name itself.
fn webp_dimensions(bytes: &[u8]) -> Result<(u32, u32), ImageError> {
    let malformed = || ImageError::Decode("malformed WebP header".into());
    // RIFF, size (4), WEBP, then the chunk: its FourCC, size (4) and data.
    let kind = bytes.get(12..16).ok_or_else(malformed)?;
    let data = bytes.get(20..).ok_or_else(malformed)?;
    let le = |at: usize, n: usize| -> Result<u32, ImageError> {
        let field = data.get(at..at + n).ok_or_else(malformed)?;
        Ok(field.iter().rev().fold(0, |v, &b| (v << 8) | u32::from(b)))
    };
    match kind {
        // Canvas width − 1 and height − 1, 24 bits each, after 4 bytes of flags.
        b"VP8X" => Ok((le(4, 3)? + 1, le(7, 3)? + 1)),
        // A 3-byte frame tag, the start code 9d 01 2a, then 14-bit width and height.
        b"VP8 " => Ok((le(6, 2)? & 0x3fff, le(8, 2)? & 0x3fff)),
        // The signature 0x2f, then width − 1 and height − 1, 14 bits each.
        b"VP8L" => {
            let bits = le(1, 4)?;
            Ok(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        _ => Err(malformed()),
    }
}

fn check_pixels(width: u32, height: u32, max_pixels: u64) -> Result<(), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::ZeroSize { width, height });
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            pixels,
            limit: max_pixels,
        });
    }
    Ok(())
}

/// RGB8 view of a decoded image; images with an alpha channel are composited onto opaque white.
pub fn to_rgb_on_white(image: DynamicImage) -> RgbImage {
    if image.color().has_alpha() {
        composite_on_white(&image.to_rgba8())
    } else {
        image.into_rgb8()
    }
}

/// Pillow's `Image.alpha_composite(white, img).convert("RGB")`, in its integer arithmetic
/// (`AlphaComposite.c`, 7 extra precision bits and rounded divisions by 255), so the result is
/// equal to the reference byte for byte rather than within ±1.
pub fn composite_on_white(rgba: &RgbaImage) -> RgbImage {
    const PRECISION_BITS: u32 = 7;
    let shift_div_255 = |a: u32| ((a >> 8) + a) >> 8;
    let mut out = RgbImage::new(rgba.width(), rgba.height());
    for (dst, src) in out.pixels_mut().zip(rgba.pixels()) {
        let [r, g, b, a] = src.0.map(u32::from);
        if a == 0 {
            dst.0 = [255, 255, 255];
            continue;
        }
        // Destination is opaque white: dst.a = 255, dst.rgb = 255.
        let blend = 255 * (255 - a);
        let out_a255 = a * 255 + blend;
        let coef1 = a * 255 * 255 * (1 << PRECISION_BITS) / out_a255;
        let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
        let channel = |s: u32| {
            let tmp = s * coef1 + 255 * coef2;
            (shift_div_255(tmp + (0x80 << PRECISION_BITS)) >> PRECISION_BITS) as u8
        };
        dst.0 = [channel(r), channel(g), channel(b)];
    }
    out
}
