//! Image front end against the phi4mm-tiny fixture (`image_preprocessing.safetensors`, manifest
//! `image_preprocessing.cases`).

use sha2::{Digest, Sha256};
use switchyard_fixtures::{max_abs_diff, Tensors};
use switchyard_phi4mm_frontend::image::{self, decode, hd::HdCanvas, ImageOptions};

const CASES: [&str; 5] = [
    "img_small",
    "img_wide",
    "img_tall",
    "img_rgba",
    "img_maxcrops",
];

fn sha256_f32(values: &[f32]) -> String {
    let mut hasher = Sha256::new();
    for v in values {
        hasher.update(v.to_le_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn case(
    name: &str,
) -> (
    serde_json::Value,
    ImageOptions,
    image::PreprocessedImage,
    HdCanvas,
) {
    let manifest = switchyard_fixtures::manifest();
    let entry = manifest["image_preprocessing"]["cases"][name].clone();
    let bytes = switchyard_fixtures::read(entry["png"].as_str().unwrap());
    let options = ImageOptions {
        max_crops: entry["dynamic_hd"].as_u64().unwrap() as usize,
        ..ImageOptions::default()
    };
    let got = image::preprocess(&bytes, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
    let rgb = decode::decode_rgb(&bytes, &options).unwrap();
    let canvas = HdCanvas::build(&rgb, options.max_crops).unwrap();
    (entry, options, got, canvas)
}

/// The resized, padded canvas equals `hd_image_uint8` byte for byte: the proof that
/// the resampler in `image::resize` is the reference's antialiased resize.
#[test]
fn canvases_are_exact() {
    let tensors = Tensors::open("image_preprocessing.safetensors");
    for name in CASES {
        let (_, _, _, canvas) = case(name);
        let (want, shape) = tensors.u8(&format!("{name}.hd_image_uint8"));
        assert_eq!(
            shape,
            vec![3, canvas.height, canvas.width],
            "{name}: canvas shape"
        );
        let n = canvas.height * canvas.width;
        let mut mismatches = 0;
        for i in 0..n {
            for c in 0..3 {
                if canvas.pixels[i * 3 + c] != want[c * n + i] {
                    mismatches += 1;
                }
            }
        }
        assert_eq!(
            mismatches,
            0,
            "{name}: {mismatches} of {} canvas bytes differ",
            3 * n
        );
    }
}

#[test]
fn masks_sizes_grids_and_token_counts_are_exact() {
    let tensors = Tensors::open("image_preprocessing.safetensors");
    for name in CASES {
        let (entry, _, got, _) = case(name);
        let (mask, mask_shape) = tensors.u8(&format!("{name}.image_attention_mask"));
        assert_eq!(
            mask_shape,
            vec![got.num_crops(), 32, 32],
            "{name}: mask shape"
        );
        assert_eq!(got.attention_mask, mask, "{name}: mask");
        let (sizes, _) = tensors.i64(&format!("{name}.image_sizes"));
        assert_eq!(
            [got.image_size.0 as i64, got.image_size.1 as i64],
            [sizes[0], sizes[1]],
            "{name}: image_sizes"
        );
        let grid = entry["crop_grid_hw"].as_array().unwrap();
        assert_eq!(
            [got.crop_grid.0 as u64, got.crop_grid.1 as u64],
            [grid[0].as_u64().unwrap(), grid[1].as_u64().unwrap()],
            "{name}: grid"
        );
        assert_eq!(
            got.num_crops() as u64,
            entry["num_crops_including_global"].as_u64().unwrap(),
            "{name}: crops"
        );
        assert_eq!(
            got.num_img_tokens as u64,
            entry["num_img_tokens"].as_u64().unwrap(),
            "{name}: tokens"
        );
        let masked = got.attention_mask.iter().filter(|&&m| m == 0).count() as u64;
        assert_eq!(
            masked,
            entry["masked_patches"].as_u64().unwrap(),
            "{name}: masked patches"
        );
        assert_eq!(
            got.pixel_values.len(),
            got.num_crops() * 3 * 448 * 448,
            "{name}: pixel_values length"
        );
    }
}

/// The full stacked input matches the reference's sha256 (`pixel_sha256_f32`) where the global
/// image is the canvas itself (448×448 canvases). For the larger canvases the tiles are exact
/// (`canvases_are_exact`) and the bicubic global image is compared within 1e-5
/// (`global_images_match`): it is not bit-exact (1.2e-7).
#[test]
fn pixel_values_match_reference_sha256() {
    for name in ["img_small", "img_rgba", "img_maxcrops"] {
        let (entry, _, got, _) = case(name);
        assert_eq!(
            sha256_f32(&got.pixel_values),
            entry["pixel_sha256_f32"].as_str().unwrap(),
            "{name}"
        );
    }
}

/// The stored 32-pixel bands of the global image within 1e-5, and the full global image by its
/// float64 statistics (sum, min, max).
#[test]
fn global_images_match() {
    let tensors = Tensors::open("image_preprocessing.safetensors");
    for name in ["img_wide", "img_tall"] {
        let (entry, _, got, _) = case(name);
        let global = &got.pixel_values[..3 * 448 * 448];
        let region = &entry["global_image_region"];
        let rows = region["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect::<Vec<_>>();
        let cols = region["cols"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect::<Vec<_>>();
        let mut band = Vec::new();
        for c in 0..3 {
            for y in rows[0]..rows[1] {
                band.extend_from_slice(
                    &global[c * 448 * 448 + y * 448 + cols[0]..c * 448 * 448 + y * 448 + cols[1]],
                );
            }
        }
        let (want, _) = tensors.f32(&format!("{name}.global_image"));
        let diff = max_abs_diff(&band, &want);
        eprintln!("{name}: global band max abs diff {diff:e}");
        assert!(diff <= 1e-5, "{name}: global band differs by {diff}");
        let stats = &entry["global_image_stats"];
        let sum: f64 = global.iter().map(|&v| f64::from(v)).sum();
        assert!(
            (sum - stats["sum_f64"].as_f64().unwrap()).abs() < 1e-2,
            "{name}: sum {sum}"
        );
        for (key, got) in [
            ("min", global.iter().cloned().fold(f32::INFINITY, f32::min)),
            (
                "max",
                global.iter().cloned().fold(f32::NEG_INFINITY, f32::max),
            ),
        ] {
            let want = stats[key].as_f64().unwrap() as f32;
            assert!((got - want).abs() <= 1e-5, "{name}: {key} {got} vs {want}");
        }
    }
}

#[test]
fn rgba_is_composited_on_white_like_pillow() {
    let bytes = switchyard_fixtures::read("inputs/img_rgba.png");
    let rgb = decode::decode_rgb(&bytes, &ImageOptions::default()).unwrap();
    let (want, shape) = Tensors::open("image_preprocessing.safetensors").u8("img_rgba.rgb_uint8");
    assert_eq!(shape, vec![3, rgb.height() as usize, rgb.width() as usize]);
    let n = (rgb.width() * rgb.height()) as usize;
    let got: Vec<u8> = (0..3)
        .flat_map(|c| rgb.as_raw().chunks_exact(3).map(move |p| p[c]))
        .collect();
    assert_eq!(got.len(), 3 * n);
    assert_eq!(got, want);
}

/// Real WebP files of each kind (`tests/data/README.md`): the size read from their headers is
/// the decoder's, and they decode; the lossless one to its exact pixels.
#[test]
fn webp_files_of_every_kind_decode_at_their_header_size() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let read = |name: &str| std::fs::read(data.join(name)).unwrap();
    for name in [
        "lossy_37x13.webp",
        "lossless_37x13.webp",
        "alpha_lossy_37x13.webp",
    ] {
        let bytes = read(name);
        let options = ImageOptions::default();
        assert_eq!(decode::probe(&bytes, &options).unwrap(), (37, 13), "{name}");
        let rgb = decode::decode_rgb(&bytes, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(rgb.dimensions(), (37, 13), "{name}");
    }
    let rgb = decode::decode_rgb(&read("lossless_37x13.webp"), &ImageOptions::default()).unwrap();
    assert_eq!(rgb.as_raw(), &read("lossless_37x13.rgb"));
}

/// JPEGs whose structure the truncation check walks (`tests/data/README.md`): several scans, a
/// restart marker after every block, a whole JPEG inside an APP1 segment. Each decodes whole,
/// and each cut before its end is refused as truncated.
#[test]
fn jpegs_of_every_structure_decode_and_their_cuts_do_not() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for name in [
        "progressive_37x13.jpg",
        "restarts_37x13.jpg",
        "thumbnail_37x13.jpg",
    ] {
        let bytes = std::fs::read(data.join(name)).unwrap();
        let options = ImageOptions::default();
        let rgb = decode::decode_rgb(&bytes, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(rgb.dimensions(), (37, 13), "{name}");
        let cut = &bytes[..bytes.len() - 2];
        let err = decode::decode_rgb(cut, &options).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{name}: {err}");
    }
}
