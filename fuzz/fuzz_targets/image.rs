//! Arbitrary bytes through bounded image decoding and dynamic-HD preprocessing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_phi4mm_frontend::image::{self, ImageOptions};

fuzz_target!(|data: &[u8]| {
    // The first byte picks max_crops so the aspect-ratio search is exercised too.
    let Some((&first, rest)) = data.split_first() else { return };
    let options = ImageOptions { max_crops: usize::from(first % 40), max_pixels: 4_000_000, ..ImageOptions::default() };
    let _ = image::preprocess(rest, &options);
});
