//! Qualification: one tiny real request through the MLX producer and through the host model, at
//! start. Token embeddings, the tower's feature-layer output and the projected image rows must
//! agree within [`TOLERANCE`] (absolute), or the producer refuses to start.

use crate::model::ImageInput;

use super::{MlxError, MlxProducer};

/// Largest absolute difference from the host model that qualifies.
pub const TOLERANCE: f32 = 1e-4;

/// The smallest image the layout accepts (one tile: the global crop and one sub-crop), with a
/// smooth pattern in [-1, 1] and the sub-crop's last two patch columns masked, so the key mask
/// and the useful-grid rule are exercised too.
pub fn probe_image(p: &MlxProducer) -> ImageInput {
    let c = &p.host.config.vision;
    let (s, grid) = (c.image_size, c.grid());
    let crop_len = c.num_channels * s * s;
    let pixel_values = (0..2 * crop_len)
        .map(|i| ((i as f32) * 0.013).sin())
        .collect();
    let mut patch_masks = vec![1u8; 2 * grid * grid];
    for r in 0..grid {
        for col in grid - 2..grid {
            patch_masks[grid * grid + r * grid + col] = 0;
        }
    }
    ImageInput {
        pixel_values,
        patch_masks,
        crops: 2,
        canvas: [s, s],
    }
}

/// Runs the probe on both and compares.
pub fn qualify(p: &MlxProducer) -> Result<(), MlxError> {
    let t = &p.host.config.text;
    let ids: Vec<u32> = [0, 1, t.vocab_size / 2, t.vocab_size - 1]
        .into_iter()
        .map(|i| i as u32)
        .collect();
    compare(
        "token embeddings",
        &p.embed(&ids)?,
        &p.host.decoder.embed(&ids),
    )?;
    let image = probe_image(p);
    let mlx = p.encode_image(&image)?;
    let host = p.host.install(|| p.host.vision.encode(&image));
    compare("vision features", &mlx.features, &host.features)?;
    compare("projected image rows", &mlx.embeds, &host.embeds)
}

/// `Ok` when `mlx` and `host` have the same length and agree within [`TOLERANCE`]; otherwise the
/// error the producer refuses to start with.
pub fn compare(what: &str, mlx: &[f32], host: &[f32]) -> Result<(), MlxError> {
    if mlx.len() != host.len() {
        return Err(MlxError::Start(format!(
            "{what}: {} values from MLX, {} from the host model",
            mlx.len(),
            host.len()
        )));
    }
    let diff = max_abs_diff(mlx, host);
    // NaN compares false: a NaN anywhere fails too.
    if diff <= TOLERANCE {
        Ok(())
    } else {
        Err(MlxError::Unqualified {
            what: what.into(),
            diff,
            tolerance: TOLERANCE,
        })
    }
}

/// Largest `|a - b|`; NaN when any pair holds one.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(d)
        }
    })
}
