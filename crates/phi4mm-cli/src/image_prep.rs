//! `phi4mm image`: one image → dynamic-HD crops, masks and token count.

use crate::tensors_out::{self, Out};
use anyhow::Context;
use std::path::PathBuf;
use switchyard_phi4mm_frontend::image::{self as hd_image, ImageOptions, CROP, MASK_SIDE};

/// Preprocess one image (PNG, JPEG, WebP, GIF) into crops.
#[derive(clap::Args)]
pub struct Args {
    /// Image file.
    #[arg(long)]
    image: PathBuf,
    /// Most sub-crops (`dynamic_hd`).
    #[arg(long, default_value_t = 36, value_parser = crate::ranges::at_least_one)]
    dynamic_hd: usize,
    /// Output: `pixel_values: f32 [1+crops, 3, 448, 448]`,
    /// `image_attention_mask: u8 [1+crops, 32, 32]`, `image_sizes: i64 [2]`,
    /// `num_img_tokens: i64 [1]`.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(&args.image).with_context(|| format!("reading {}", args.image.display()))?;
    let options = ImageOptions {
        max_crops: args.dynamic_hd,
        ..ImageOptions::default()
    };
    let image = hd_image::preprocess(&bytes, &options)
        .with_context(|| format!("{}", args.image.display()))?;
    let crops = image.num_crops();
    tensors_out::write(
        &args.out,
        &[
            Out::f32(
                "pixel_values",
                vec![crops, 3, CROP, CROP],
                &image.pixel_values,
            ),
            Out::u8(
                "image_attention_mask",
                vec![crops, MASK_SIDE, MASK_SIDE],
                image.attention_mask,
            ),
            Out::i64(
                "image_sizes",
                vec![2],
                &[image.image_size.0 as i64, image.image_size.1 as i64],
            ),
            Out::i64("num_img_tokens", vec![1], &[image.num_img_tokens as i64]),
        ],
    )
}
