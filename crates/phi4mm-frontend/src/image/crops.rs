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
    TABLE.get_or_init(|| std::array::from_fn(|v| (v as f32 - 127.5) / 127.5))
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
            tile(canvas, table, (r, c), dst);
        }
    });
    out
}

/// Tile `(r, c)` of the canvas, normalised, planar `[3, 448, 448]`.
fn tile(canvas: &HdCanvas, table: &[f32; 256], (r, c): (usize, usize), dst: &mut [f32]) {
    let stride = canvas.width * 3;
    for (channel, plane) in dst.chunks_exact_mut(CROP * CROP).enumerate() {
        for (y, line) in plane.chunks_exact_mut(CROP).enumerate() {
            let start = (r * CROP + y) * stride + c * CROP * 3 + channel;
            let src = canvas.pixels[start..].iter().step_by(3);
            for (v, &byte) in line.iter_mut().zip(src) {
                *v = table[usize::from(byte)];
            }
        }
    }
}
