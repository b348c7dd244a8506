//! Front-end timings: log-mel features of a 30 s clip and preprocessing of a 1344×896 image.
//!
//! `cargo bench -p switchyard-phi4mm --bench frontend` (release profile). Inputs are generated in
//! memory (a 30 s 16 kHz 16-bit WAV of a chirp plus noise; a 1344×896 RGB PNG of gradients and
//! noise), so the numbers include decoding. Reports the median and min of several runs.

use std::io::Cursor;
use std::time::Instant;
use switchyard_phi4mm_frontend::audio::{self, AudioOptions, ResampleMode};
use switchyard_phi4mm_frontend::image::{self, ImageOptions};

fn wav_30s(rate: u32) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut cursor = Cursor::new(Vec::new());
    let mut writer = hound::WavWriter::new(&mut cursor, spec).unwrap();
    let mut seed = 12345u32;
    for i in 0..30 * rate {
        let t = f64::from(i) / f64::from(rate);
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let noise = f64::from(seed >> 16) / 65536.0 - 0.5;
        let v = 0.3 * (2.0 * std::f64::consts::PI * (200.0 + 100.0 * t) * t).sin() + 0.05 * noise;
        writer.write_sample((v * 32767.0) as i16).unwrap();
    }
    writer.finalize().unwrap();
    cursor.into_inner()
}

fn png_1344x896() -> Vec<u8> {
    let mut seed = 7u32;
    let img = ::image::RgbImage::from_fn(1344, 896, |x, y| {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        ::image::Rgb([(x / 6) as u8, (y / 4) as u8, (seed >> 24) as u8])
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ::image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn time(label: &str, runs: usize, mut f: impl FnMut()) {
    f(); // warm-up (plans, mel bank)
    let mut ms: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "{label:<58} median {:8.2} ms   min {:8.2} ms   ({runs} runs)",
        ms[runs / 2],
        ms[0]
    );
}

fn main() {
    let wav16 = wav_30s(16_000);
    let wav44 = wav_30s(44_100);
    let png = png_1344x896();
    let polyphase = AudioOptions::default();
    let reference = AudioOptions {
        resample: ResampleMode::Reference,
        ..AudioOptions::default()
    };
    time("audio: 30 s 16 kHz WAV -> log-mel [2998, 80]", 20, || {
        let f = audio::features_from_bytes(&wav16, &polyphase).unwrap();
        assert_eq!(f.frames, 2998);
    });
    time(
        "audio: 30 s 44.1 kHz WAV -> polyphase 16 kHz -> log-mel",
        10,
        || {
            audio::features_from_bytes(&wav44, &polyphase).unwrap();
        },
    );
    time("audio: 30 s 44.1 kHz WAV, reference mode", 10, || {
        audio::features_from_bytes(&wav44, &reference).unwrap();
    });
    time(
        "image: 1344x896 PNG -> 7 crops (decode included)",
        20,
        || {
            let p = image::preprocess(&png, &ImageOptions::default()).unwrap();
            assert_eq!(p.num_img_tokens, 1841);
        },
    );
    let rgb = ::image::load_from_memory(&png).unwrap().to_rgb8();
    time("image: 1344x896 decoded RGB -> 7 crops", 20, || {
        image::preprocess_rgb(&rgb, 36).unwrap();
    });
}
