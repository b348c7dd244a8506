//! Image front end (dynamic HD, docs/phi4mm-model.md §8, fixture README §8): encoded image →
//! crops, masks and the image token count.
//!
//! 1. [`decode`]: PNG, JPEG, WebP, GIF (first frame); the pixel limit is checked from the header
//!    before decoding; transparency is composited onto white like Pillow's `alpha_composite`.
//! 2. [`hd`]: crop grid, antialiased bilinear [`resize`] (PyTorch's float path, bit-equal to the
//!    reference), white padding, patch mask, token count.
//! 3. [`crops`]: normalisation fused into the [`bicubic`] global crop (PyTorch bicubic,
//!    a = −0.75, no antialias) and the tiles.
//!
//! Entry points: [`preprocess`] (bytes) and [`preprocess_rgb`] (decoded pixels).

pub mod bicubic;
mod constants;
pub mod crops;
pub mod decode;
mod error;
pub mod hd;
mod options;
pub mod resize;

pub use constants::{CROP, MASK_SIDE, PATCH};
pub use error::ImageError;
pub use options::ImageOptions;

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

/// Tokens the encoded image will occupy in the prompt, from its header alone (no decoding): the
/// `num_img_tokens` [`preprocess`] gives, and the same errors for a header it refuses.
pub fn token_count_from_header(bytes: &[u8], options: &ImageOptions) -> Result<usize, ImageError> {
    let (w, h) = decode::probe(bytes, options)?;
    hd::token_count(w as usize, h as usize, options.max_crops)
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
    let (ch, cw) = (canvas.height, canvas.width);
    let pixel_values = crops::pixel_values(&canvas);
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
