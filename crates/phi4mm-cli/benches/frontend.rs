//! Front-end timings: log-mel features of a 30 s clip and preprocessing of a 1344×896 image.
//!
//! `cargo bench -p switchyard-phi4mm-cli --bench frontend` (release profile, the caller's rayon
//! pool: one thread per core). The inputs are `phi4mm bench-frontend`'s (its `inputs` module),
//! so the numbers include decoding. Reports the median and min of several runs;
//! `phi4mm bench-frontend` is the machine-readable form with a thread count.

#[path = "../src/bench_frontend/inputs.rs"]
mod inputs;

use std::time::Instant;
use switchyard_phi4mm_frontend::audio::{self, AudioOptions, ResampleMode};
use switchyard_phi4mm_frontend::image::{self, ImageOptions};

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
    let wav16 = inputs::speech_like_wav(16_000);
    let wav44 = inputs::speech_like_wav(44_100);
    let png = inputs::photo_like_png();
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
