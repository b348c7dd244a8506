//! Model inputs from the canvas: normalisation fused into the extraction of the global image and
//! the tiles, so the normalised float canvas is never materialised.

use super::bicubic;
use super::constants::CROP;
use super::hd::HdCanvas;
use rayon::prelude::*;
use std::sync::OnceLock;

/// `(u8 − 127.5) / 127.5` in float32 for every byte, which is bit-equal to the reference's
/// rescale-then-normalise (docs/phi4mm-model.md §8.5).
pub fn normalise_table() -> &'static [f32; 256] {
    static TABLE: OnceLock<[f32; 256]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|v| normalise(v as u8)))
}

/// One byte's normalised value (what [`normalise_table`] holds).
#[inline(always)]
fn normalise(v: u8) -> f32 {
    (f32::from(v) - 127.5) / 127.5
}

/// `[1 + rows · cols, 3, 448, 448]` float32: the bicubic global image first, then the tiles
/// row-major, each planar. The global image and the tiles are computed in parallel on the
/// caller's rayon pool.
pub fn pixel_values(canvas: &HdCanvas) -> Vec<f32> {
    let (rows, cols) = canvas.crop_grid;
    let crop = 3 * CROP * CROP;
    let table = normalise_table();
    let mut out = vec![0f32; (1 + rows * cols) * crop];
    out.par_chunks_mut(crop).enumerate().for_each(|(i, dst)| {
        if i == 0 {
            bicubic::resize_rgb8_normalised(
                &canvas.pixels,
                table,
                (canvas.height, canvas.width),
                (CROP, CROP),
                dst,
            );
        } else {
            let (r, c) = ((i - 1) / cols, (i - 1) % cols);
            tile(canvas, (r, c), dst);
        }
    });
    out
}

/// Tile `(r, c)` of the canvas, normalised, planar `[3, 448, 448]`: each source row is read once
/// and split into the three planes.
fn tile(canvas: &HdCanvas, (r, c): (usize, usize), dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() {
        // SAFETY: the CPU supports the features `tile_avx2` is compiled for.
        return unsafe { tile_avx2(canvas, (r, c), dst) };
    }
    tile_body(canvas, (r, c), dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2(canvas: &HdCanvas, (r, c): (usize, usize), dst: &mut [f32]) {
    tile_body(canvas, (r, c), dst);
}

/// The normalisation is computed rather than looked up in [`normalise_table`] (the same
/// expression, so the same bits): arithmetic on eight pixels at a time beats a load per byte.
#[inline(always)]
fn tile_body(canvas: &HdCanvas, (r, c): (usize, usize), dst: &mut [f32]) {
    let stride = canvas.width * 3;
    let (red, rest) = dst.split_at_mut(CROP * CROP);
    let (green, blue) = rest.split_at_mut(CROP * CROP);
    let lines = red
        .chunks_exact_mut(CROP)
        .zip(green.chunks_exact_mut(CROP))
        .zip(blue.chunks_exact_mut(CROP));
    for (y, ((red, green), blue)) in lines.enumerate() {
        let start = (r * CROP + y) * stride + c * CROP * 3;
        let pixels = canvas.pixels[start..start + CROP * 3].chunks_exact(3);
        for (((px, red), green), blue) in pixels.zip(red).zip(green).zip(blue) {
            *red = normalise(px[0]);
            *green = normalise(px[1]);
            *blue = normalise(px[2]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canvas() -> HdCanvas {
        // 1000×600 → a 3×2 grid with resize and padding.
        let rgb = image::RgbImage::from_fn(1000, 600, |x, y| {
            image::Rgb([(x % 251) as u8, (y % 241) as u8, ((x * y) % 256) as u8])
        });
        HdCanvas::build(&rgb, 36).unwrap()
    }

    /// Each tile is the matching window of the normalised planar canvas.
    #[test]
    fn tiles_are_windows_of_the_normalised_canvas() {
        let canvas = canvas();
        let (rows, cols) = canvas.crop_grid;
        let planes = canvas.normalised();
        let values = pixel_values(&canvas);
        let n = canvas.height * canvas.width;
        for i in 0..rows * cols {
            let (r, c) = (i / cols, i % cols);
            let tile = &values[(1 + i) * 3 * CROP * CROP..][..3 * CROP * CROP];
            for ch in 0..3 {
                for y in 0..CROP {
                    let row = ch * n + (r * CROP + y) * canvas.width + c * CROP;
                    assert_eq!(
                        &tile[(ch * CROP + y) * CROP..][..CROP],
                        &planes[row..row + CROP],
                        "tile {r},{c} channel {ch} row {y}"
                    );
                }
            }
        }
    }

    /// The global image and the tiles do not depend on how many threads computed them.
    #[test]
    fn pixel_values_do_not_depend_on_the_thread_count() {
        let canvas = canvas();
        let run = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| pixel_values(&canvas))
        };
        assert_eq!(run(1), run(3));
    }
}
