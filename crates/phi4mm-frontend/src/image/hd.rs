//! Dynamic-HD canvas: crop grid, resize, pad, patch mask and token count
//! (docs/phi4mm-model.md §8.2–8.6).

use super::constants::{CROP, MASK_SIDE, PATCH};
use super::error::ImageError;
use image::RgbImage;

/// The resized and padded source on the HD canvas, before normalisation.
#[derive(Clone, Debug, PartialEq)]
pub struct HdCanvas {
    /// Canvas height in pixels (448 · rows).
    pub height: usize,
    /// Canvas width in pixels (448 · cols).
    pub width: usize,
    /// Crop grid (rows, cols).
    pub crop_grid: (usize, usize),
    /// Canvas pixels, RGB interleaved, row-major (`height · width · 3`).
    pub pixels: Vec<u8>,
    /// Patch mask `[32 · rows, 32 · cols]`, row-major.
    pub mask: Vec<u8>,
}

/// Crop grid `(cols, rows)` for a `width × height` source (the reference's `(w_crops, h_crops)`).
///
/// When `ceil(w/448) · ceil(h/448)` exceeds `max_crops`, the grid with the closest aspect ratio is
/// chosen among all `(i, j)` with `i · j ≤ max_crops`, visited by increasing product; on an exact
/// tie a later candidate wins if the image area exceeds half the candidate's canvas. Python visits
/// equal products in set-iteration order; here they are visited by increasing `i` (only reachable
/// for sources above ~2688 px a side with exact ties; docs/phi4mm-model.md §8.2 marks it
/// unverified).
pub fn crop_grid(width: usize, height: usize, max_crops: usize) -> (usize, usize) {
    let (cw, ch) = (width.div_ceil(CROP), height.div_ceil(CROP));
    if cw * ch <= max_crops {
        return (cw, ch);
    }
    let mut candidates: Vec<(usize, usize)> = (1..=max_crops)
        .flat_map(|i| {
            (1..=max_crops)
                .filter(move |j| i * j <= max_crops)
                .map(move |j| (i, j))
        })
        .collect();
    candidates.sort_by_key(|&(i, j)| i * j); // stable: ties stay in increasing i
    let aspect = width as f64 / height as f64;
    let area = (width * height) as f64;
    let mut best = (1, 1);
    let mut best_diff = f64::INFINITY;
    for (i, j) in candidates {
        let diff = (aspect - i as f64 / j as f64).abs();
        if diff < best_diff {
            best_diff = diff;
            best = (i, j);
        } else if diff == best_diff && area > 0.5 * (CROP * CROP) as f64 * (i * j) as f64 {
            best = (i, j);
        }
    }
    best
}

/// Size the source is resized to before padding, `(width, height)`: scale to fit the canvas,
/// truncating the scaled side like Python's `int()` (float64 arithmetic).
pub fn fit_size(width: usize, height: usize, canvas_w: usize, canvas_h: usize) -> (usize, usize) {
    let rw = canvas_w as f64 / width as f64;
    let rh = canvas_h as f64 / height as f64;
    if rw < rh {
        (canvas_w, (height as f64 * rw) as usize)
    } else {
        ((width as f64 * rh) as usize, canvas_h)
    }
}

/// Image tokens of a `width × height` source with at most `max_crops` tiles, from its size alone:
/// the value [`HdCanvas::num_img_tokens`] gives for the canvas [`HdCanvas::build`] makes (the
/// same errors for an unusable size), `273 + rows · (cols + 1)` with the valid pooled rows and
/// columns of the padded grid.
pub fn token_count(width: usize, height: usize, max_crops: usize) -> Result<usize, ImageError> {
    if max_crops == 0 {
        return Err(ImageError::NoCrops);
    }
    if width == 0 || height == 0 {
        return Err(ImageError::ZeroSize {
            width: width as u32,
            height: height as u32,
        });
    }
    let (tw, th) = crop_grid(width, height, max_crops);
    let (canvas_w, canvas_h) = (CROP * tw, CROP * th);
    let (nw, nh) = fit_size(width, height, canvas_w, canvas_h);
    if nw == 0 || nh == 0 {
        return Err(ImageError::Degenerate {
            width: width as u32,
            height: height as u32,
            canvas_w,
            canvas_h,
            resized_w: nw,
            resized_h: nh,
        });
    }
    let valid_cols = MASK_SIDE * tw - (canvas_w - nw) / PATCH;
    let valid_rows = MASK_SIDE * th - (canvas_h - nh) / PATCH;
    // Every second mask row and column (`m = mask[::2, ::2]`).
    let (rows, cols) = (valid_rows.div_ceil(2), valid_cols.div_ceil(2));
    Ok(256 + 1 + rows * cols + rows + 16)
}

impl HdCanvas {
    /// Builds the canvas of `rgb` with at most `max_crops` tiles.
    pub fn build(rgb: &RgbImage, max_crops: usize) -> Result<Self, ImageError> {
        if max_crops == 0 {
            return Err(ImageError::NoCrops);
        }
        let (w, h) = (rgb.width() as usize, rgb.height() as usize);
        if w == 0 || h == 0 {
            return Err(ImageError::ZeroSize {
                width: rgb.width(),
                height: rgb.height(),
            });
        }
        let (tw, th) = crop_grid(w, h, max_crops);
        let (canvas_w, canvas_h) = (CROP * tw, CROP * th);
        let (nw, nh) = fit_size(w, h, canvas_w, canvas_h);
        if nw == 0 || nh == 0 {
            return Err(ImageError::Degenerate {
                width: rgb.width(),
                height: rgb.height(),
                canvas_w,
                canvas_h,
                resized_w: nw,
                resized_h: nh,
            });
        }
        let resized = resize_bilinear_antialias(rgb, nw, nh);
        let pixels = if (nw, nh) == (canvas_w, canvas_h) {
            resized
        } else {
            let mut pixels = vec![255u8; canvas_w * canvas_h * 3];
            for (dst, src) in pixels
                .chunks_exact_mut(canvas_w * 3)
                .zip(resized.chunks_exact(nw * 3))
            {
                dst[..nw * 3].copy_from_slice(src);
            }
            pixels
        };
        let (pad_w, pad_h) = (canvas_w - nw, canvas_h - nh);
        let (mask_w, mask_h) = (MASK_SIDE * tw, MASK_SIDE * th);
        // Padding narrower than a patch is not masked (floor).
        let (masked_cols, masked_rows) = (pad_w / PATCH, pad_h / PATCH);
        let mut mask = vec![1u8; mask_w * mask_h];
        for y in 0..mask_h {
            for x in 0..mask_w {
                if y >= mask_h - masked_rows || x >= mask_w - masked_cols {
                    mask[y * mask_w + x] = 0;
                }
            }
        }
        Ok(Self {
            height: canvas_h,
            width: canvas_w,
            crop_grid: (th, tw),
            pixels,
            mask,
        })
    }

    /// Canvas normalised to [−1, 1], planar `[3, height, width]`, through
    /// [`super::crops::normalise_table`] (the model inputs take the table's values directly from
    /// the bytes; this is for tools that want the whole canvas).
    pub fn normalised(&self) -> Vec<f32> {
        let lut = super::crops::normalise_table();
        let n = self.height * self.width;
        let mut out = vec![0f32; 3 * n];
        for (i, px) in self.pixels.chunks_exact(3).enumerate() {
            for c in 0..3 {
                out[c * n + i] = lut[px[c] as usize];
            }
        }
        out
    }

    /// `256 + 1 + sum(m) + sum(m[:, 0]) + 16` with `m = mask[::2, ::2]` (docs/phi4mm-model.md
    /// §8.6): the global crop's 16×16 rows with a separator each, the separator token, the valid
    /// sub-crop rows each with its separator.
    pub fn num_img_tokens(&self) -> usize {
        let mask_w = MASK_SIDE * self.crop_grid.1;
        let mask_h = MASK_SIDE * self.crop_grid.0;
        let mut valid = 0;
        let mut first_column = 0;
        for y in (0..mask_h).step_by(2) {
            for x in (0..mask_w).step_by(2) {
                let v = usize::from(self.mask[y * mask_w + x]);
                valid += v;
                if x == 0 {
                    first_column += v;
                }
            }
        }
        256 + 1 + valid + first_column + 16
    }
}

/// Antialiased bilinear resize of RGB8 to `width × height` (see [`super::resize`]).
pub fn resize_bilinear_antialias(rgb: &RgbImage, width: usize, height: usize) -> Vec<u8> {
    super::resize::resize_rgb8(
        rgb.as_raw(),
        rgb.width() as usize,
        rgb.height() as usize,
        width,
        height,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_count_from_the_size_equals_the_canvas() {
        for (w, h, crops) in [
            (1, 1, 36),
            (7, 300, 36),
            (448, 448, 36),
            (449, 448, 36),
            (640, 480, 36),
            (1000, 300, 36),
            (300, 1000, 4),
            (1920, 1080, 36),
            (3000, 100, 36),
            (100, 3000, 16),
            (900, 900, 1),
        ] {
            let rgb = RgbImage::new(w, h);
            let want = HdCanvas::build(&rgb, crops).map(|c| c.num_img_tokens());
            let got = token_count(w as usize, h as usize, crops);
            assert_eq!(got.ok(), want.ok(), "{w}x{h}, {crops} crops");
        }
        assert!(matches!(token_count(10, 10, 0), Err(ImageError::NoCrops)));
    }

    #[test]
    fn grids_of_the_model_doc() {
        // docs/phi4mm-model.md §8.6 examples (w × h → cols × rows).
        assert_eq!(crop_grid(640, 480, 36), (2, 2));
        assert_eq!(crop_grid(1344, 896, 36), (3, 2));
        assert_eq!(crop_grid(1920, 1080, 36), (5, 3));
        assert_eq!(crop_grid(4000, 3000, 36), (4, 3));
        assert_eq!(crop_grid(100, 2000, 36), (1, 5));
        assert_eq!(crop_grid(714, 560, 3), (1, 1));
    }

    #[test]
    fn token_counts_of_the_model_doc() {
        for (w, h, tokens) in [
            (640, 480, 1065),
            (1344, 896, 1841),
            (448, 448, 545),
            (200, 100, 409),
            (1920, 1080, 3918),
            (4000, 3000, 3393),
            (100, 2000, 673),
        ] {
            let canvas = HdCanvas::build(&RgbImage::new(w, h), 36).unwrap();
            assert_eq!(canvas.num_img_tokens(), tokens, "{w}x{h}");
        }
    }
}
