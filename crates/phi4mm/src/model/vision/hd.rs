//! The HD layout of an image's rows (order `sub_glb`): the stitched sub-crop grid with a learned
//! separator closing each row, the global separator, then the global crop's grid, each row again
//! closed by a separator. Both backends pool on their own and place the pooled rows here, so their
//! rows stand in the same order.

use crate::checkpoint::schema::VISION_PREFIX;
use crate::checkpoint::{Checkpoint, VisionConfig};

use super::input::ImageInput;

/// Why an image's crops, pixels or masks do not fit its HD canvas.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageShapeError {
    #[error("canvas {canvas:?} is not a multiple of {size}")]
    Canvas { canvas: [usize; 2], size: usize },
    #[error("expected {crops} crops of {crop_len} pixels and {mask_len} mask entries")]
    Crops {
        crops: usize,
        crop_len: usize,
        mask_len: usize,
    },
}

/// The layout and its two learned separator rows (`[vision hidden]` each).
pub struct HdLayout {
    config: VisionConfig,
    sub_sep: Vec<f32>,
    glb_sep: Vec<f32>,
}

impl HdLayout {
    pub fn load(ck: &Checkpoint) -> Self {
        let sep = |name: &str| ck.tensor(&format!("{VISION_PREFIX}{name}")).to_f32_vec();
        HdLayout {
            config: ck.config.vision.clone(),
            sub_sep: sep("sub_img_feature_extensor"),
            glb_sep: sep("global_img_feature_extensor"),
        }
    }

    /// Tiles (rows, cols) of the HD canvas.
    pub fn tiles(&self, image: &ImageInput) -> (usize, usize) {
        let s = self.config.image_size;
        (image.canvas[0] / s, image.canvas[1] / s)
    }

    /// A canvas of whole tiles, one global crop plus one crop per tile, each with its pixels and
    /// its patch mask.
    pub fn check(&self, image: &ImageInput) -> Result<(), ImageShapeError> {
        let c = &self.config;
        let s = c.image_size;
        let [h, w] = image.canvas;
        if h == 0 || w == 0 || h % s != 0 || w % s != 0 {
            return Err(ImageShapeError::Canvas {
                canvas: image.canvas,
                size: s,
            });
        }
        let (th, tw) = self.tiles(image);
        let crops = 1 + th * tw;
        let crop_len = c.num_channels * s * s;
        let mask_len = c.grid() * c.grid();
        if image.crops != crops
            || image.pixel_values.len() != crops * crop_len
            || image.patch_masks.len() != crops * mask_len
        {
            return Err(ImageShapeError::Crops {
                crops,
                crop_len,
                mask_len,
            });
        }
        Ok(())
    }

    /// Number of decoder rows the image produces (273 + Uh·(Uw+1) for the official sizes).
    pub fn token_count(&self, image: &ImageInput) -> usize {
        let g = self.config.grid() / 2;
        let (uh, uw) = self.useful_grid(image);
        g * (g + 1) + 1 + uh * (uw + 1)
    }

    /// Useful pooled rows/cols of the stitched sub-crop grid, read from the masks downsampled by
    /// taking every second patch row and column inside each tile.
    fn useful_grid(&self, image: &ImageInput) -> (usize, usize) {
        let grid = self.config.grid();
        let (th, tw) = self.tiles(image);
        let m =
            |crop: usize, r: usize, c: usize| image.patch_masks[(crop * grid + r) * grid + c] != 0;
        // First column of the stitched downsampled mask: tiles (i, 0), rows 0, 2, 4, …
        let uh = (0..th)
            .map(|i| {
                (0..grid)
                    .step_by(2)
                    .filter(|&r| m(1 + i * tw, r, 0))
                    .count()
            })
            .sum();
        let uw = (0..tw)
            .map(|j| (0..grid).step_by(2).filter(|&c| m(1 + j, 0, c)).count())
            .sum();
        (uh, uw)
    }

    /// Where each of the image's rows comes from, in order: the rule both backends (and the MLX
    /// producer) place their pooled rows by.
    pub fn rows(&self, image: &ImageInput) -> Vec<HdRow> {
        let g = self.config.grid() / 2;
        let (_, tw) = self.tiles(image);
        let (uh, uw) = self.useful_grid(image);
        let mut rows = Vec::with_capacity(self.token_count(image));
        for r in 0..uh {
            for c in 0..uw {
                rows.push(HdRow::Pooled {
                    crop: 1 + (r / g) * tw + c / g,
                    index: (r % g) * g + c % g,
                });
            }
            rows.push(HdRow::SubSeparator);
        }
        rows.push(HdRow::GlobalSeparator);
        for r in 0..g {
            for c in 0..g {
                rows.push(HdRow::Pooled {
                    crop: 0,
                    index: r * g + c,
                });
            }
            rows.push(HdRow::SubSeparator);
        }
        rows
    }

    /// The learned separators `(sub, global)`, `[hidden]` each.
    pub fn separators(&self) -> (&[f32], &[f32]) {
        (&self.sub_sep, &self.glb_sep)
    }

    /// The image's rows before the projection, `[token_count, hidden]`, from each crop's 2×2-pooled
    /// grid (`pooled[crop]`, `[(grid/2)², hidden]`, global crop first).
    pub fn assemble(&self, image: &ImageInput, pooled: &[Vec<f32>]) -> Vec<f32> {
        let hid = self.config.hidden_size;
        let layout = self.rows(image);
        let mut rows = Vec::with_capacity(layout.len() * hid);
        for row in layout {
            rows.extend_from_slice(match row {
                HdRow::Pooled { crop, index } => &pooled[crop][index * hid..(index + 1) * hid],
                HdRow::SubSeparator => &self.sub_sep,
                HdRow::GlobalSeparator => &self.glb_sep,
            });
        }
        rows
    }
}

/// One row of an image's HD layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HdRow {
    /// Row `index` of crop `crop`'s pooled grid (crop 0 is the global crop).
    Pooled { crop: usize, index: usize },
    /// The learned separator closing each row of a grid.
    SubSeparator,
    /// The learned separator between the sub-crop grid and the global crop.
    GlobalSeparator,
}
