//! Image front end (dynamic HD, docs/phi4mm-model.md §8, fixture README §8): encoded image →
//! crops, masks and the image token count.
//!
//! 1. [`decode`]: PNG, JPEG, WebP, GIF (first frame); the pixel limit is checked from the header
//!    before decoding; transparency is composited onto white like Pillow's `alpha_composite`.
//! 2. [`hd`]: crop grid, antialiased bilinear [`resize`] (PyTorch's float path, bit-equal to the
//!    reference), white padding, patch mask, token count.
//! 3. [`bicubic`]: the global crop (PyTorch bicubic, a = −0.75, no antialias) and the tiles.
//!
//! Entry points: [`preprocess`] (bytes) and [`preprocess_rgb`] (decoded pixels).

pub mod bicubic;
pub mod decode;
pub mod hd;
pub mod resize;

/// Side of one crop, in pixels.
pub const CROP: usize = 448;
/// Side of the vision tower's patch.
pub const PATCH: usize = 14;
/// Patches per crop side (448 / 14).
pub const MASK_SIDE: usize = CROP / PATCH;

/// Options of one preprocessing call.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageOptions {
    /// Most sub-crops per image (`dynamic_hd`; 36 in the official preprocessor config).
    pub max_crops: usize,
    /// Decoded pixel limit (width × height), checked from the header before decoding.
    pub max_pixels: u64,
    /// Encoded size limit in bytes.
    pub max_bytes: usize,
}

impl Default for ImageOptions {
    fn default() -> Self {
        Self::from_limits(&crate::limits::Limits::default())
    }
}

impl ImageOptions {
    /// Options with the per-image limits of `limits` and the official 36 crops.
    pub fn from_limits(limits: &crate::limits::Limits) -> Self {
        Self {
            max_crops: 36,
            max_pixels: limits.max_image_pixels,
            max_bytes: limits.max_image_bytes,
        }
    }
}

/// Model inputs of one image.
#[derive(Clone, Debug, PartialEq)]
pub struct PreprocessedImage {
    /// `[1 + crops, 3, 448, 448]` float32: the global image first, then the tiles row-major.
    pub pixel_values: Vec<f32>,
    /// `[1 + crops, 32, 32]`: 1 = valid patch; the global crop is all ones.
    pub attention_mask: Vec<u8>,
    /// Canvas (height, width) in pixels (`image_sizes`).
    pub image_size: (usize, usize),
    /// Crop grid (rows, cols).
    pub crop_grid: (usize, usize),
    /// Tokens this image occupies in the prompt.
    pub num_img_tokens: usize,
}

impl PreprocessedImage {
    /// Number of crops including the global one.
    pub fn num_crops(&self) -> usize {
        1 + self.crop_grid.0 * self.crop_grid.1
    }
}

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

/// Decodes an encoded image and preprocesses it.
pub fn preprocess(bytes: &[u8], options: &ImageOptions) -> Result<PreprocessedImage, ImageError> {
    let rgb = decode::decode_rgb(bytes, options)?;
    preprocess_rgb(&rgb, options.max_crops)
}

/// Preprocesses decoded RGB pixels (`RgbImage`, alpha already composited).
pub fn preprocess_rgb(
    rgb: &image::RgbImage,
    max_crops: usize,
) -> Result<PreprocessedImage, ImageError> {
    let canvas = hd::HdCanvas::build(rgb, max_crops)?;
    let (th, tw) = canvas.crop_grid;
    let normalised = canvas.normalised();
    let (ch, cw) = (canvas.height, canvas.width);
    let plane = CROP * CROP;
    let crops = 1 + th * tw;
    let mut pixel_values = Vec::with_capacity(crops * 3 * plane);
    pixel_values.extend(bicubic::resize_chw(&normalised, 3, ch, cw, CROP, CROP));
    for r in 0..th {
        for c in 0..tw {
            for channel in 0..3 {
                let base = channel * ch * cw;
                for y in r * CROP..(r + 1) * CROP {
                    let row = base + y * cw + c * CROP;
                    pixel_values.extend_from_slice(&normalised[row..row + CROP]);
                }
            }
        }
    }
    let mut attention_mask = vec![1u8; MASK_SIDE * MASK_SIDE];
    let mask_w = MASK_SIDE * tw;
    for r in 0..th {
        for c in 0..tw {
            for y in r * MASK_SIDE..(r + 1) * MASK_SIDE {
                let row = y * mask_w + c * MASK_SIDE;
                attention_mask.extend_from_slice(&canvas.mask[row..row + MASK_SIDE]);
            }
        }
    }
    Ok(PreprocessedImage {
        pixel_values,
        attention_mask,
        image_size: (ch, cw),
        crop_grid: (th, tw),
        num_img_tokens: canvas.num_img_tokens(),
    })
}
