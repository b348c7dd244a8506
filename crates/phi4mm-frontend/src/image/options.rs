//! Options of one image preprocessing call.

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
