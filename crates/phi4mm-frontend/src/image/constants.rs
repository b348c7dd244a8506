//! Crop and patch geometry shared by the image stages.

/// Side of one crop, in pixels.
pub const CROP: usize = 448;
/// Side of the vision tower's patch.
pub const PATCH: usize = 14;
/// Patches per crop side (448 / 14).
pub const MASK_SIDE: usize = CROP / PATCH;
