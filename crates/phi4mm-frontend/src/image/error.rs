//! Errors of the image front end.

/// Everything that can go wrong between image bytes and crops.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image is {got} bytes, over the limit max_image_bytes = {limit}")]
    TooManyBytes { got: usize, limit: usize },
    #[error(
        "image is {width}x{height} = {pixels} pixels, over the limit max_image_pixels = {limit}"
    )]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
        limit: u64,
    },
    #[error("image is empty (0 bytes)")]
    Empty,
    #[error("unsupported image format (accepted: PNG, JPEG, WebP, GIF)")]
    UnsupportedFormat,
    #[error("cannot decode image: {0}")]
    Decode(String),
    #[error("image has zero width or height ({width}x{height})")]
    ZeroSize { width: u32, height: u32 },
    #[error("image {width}x{height} is too thin for a {canvas_w}x{canvas_h} canvas: it would resize to {resized_w}x{resized_h}")]
    Degenerate {
        width: u32,
        height: u32,
        canvas_w: usize,
        canvas_h: usize,
        resized_w: usize,
        resized_h: usize,
    },
    #[error("max_crops must be at least 1")]
    NoCrops,
}
