//! [`ImageInput`]: one preprocessed image as the tower and the HD layout read it.

/// One preprocessed image: global crop first, then the sub-crops in row-major order.
#[derive(Clone, Debug)]
pub struct ImageInput {
    /// `[crops, channels, size, size]`, normalised to [-1, 1].
    pub pixel_values: Vec<f32>,
    /// `[crops, grid, grid]` patch mask (1 = valid).
    pub patch_masks: Vec<u8>,
    pub crops: usize,
    /// HD canvas `[height, width]` in pixels (multiples of the crop size).
    pub canvas: [usize; 2],
}
