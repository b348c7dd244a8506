//! The front-end benchmark's inputs, generated deterministically (no files shipped, no RNG crate):
//! the same bytes on every machine and every run, so the Python reference
//! (`scripts/bench-vs-transformers/frontend.py`) can time the very same clips and image.
//!
//! - Audio: 30 s of mono 16-bit PCM WAV, a speech-like signal (a gliding harmonic tone with a
//!   syllable-rate envelope) plus white noise at −26 dBFS, from a 32-bit LCG; at 16 kHz and 44.1 kHz.
//! - Image: a 1344×896 RGB PNG that compresses like a photo (smooth colour fields, soft edges and
//!   ±6 levels of grain), written by the `image` crate's default PNG encoder. 1344×896 is a 3×2
//!   crop grid that needs no resize, so the time is decoding, normalisation, the bicubic global
//!   image and the crops.

use std::io::Cursor;

/// A 32-bit linear congruential generator (Numerical Recipes constants).
struct Lcg(u32);

impl Lcg {
    /// Uniform in [−0.5, 0.5).
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        f64::from(self.0 >> 8) / f64::from(1u32 << 24) - 0.5
    }
}

/// Seconds of every benchmark clip.
pub const CLIP_SECONDS: u32 = 30;
/// Size of the benchmark image.
pub const IMAGE_W: u32 = 1344;
pub const IMAGE_H: u32 = 896;

/// A `CLIP_SECONDS` mono 16-bit WAV at `rate` Hz.
pub fn speech_like_wav(rate: u32) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut cursor = Cursor::new(Vec::new());
    let mut writer = hound::WavWriter::new(&mut cursor, spec).expect("in-memory WAV");
    let mut noise = Lcg(12345);
    let tau = 2.0 * std::f64::consts::PI;
    let mut phase = 0.0f64;
    for i in 0..CLIP_SECONDS * rate {
        let t = f64::from(i) / f64::from(rate);
        // Pitch glides between 110 and 190 Hz; four harmonics; ~4 syllables a second.
        let f0 = 150.0 + 40.0 * (tau * 0.3 * t).sin();
        phase += tau * f0 / f64::from(rate);
        let voiced: f64 = (1..=4)
            .map(|h| (f64::from(h) * phase).sin() / f64::from(h))
            .sum();
        let envelope = 0.5 + 0.5 * (tau * 4.0 * t).sin();
        let v = 0.25 * envelope * voiced + 0.05 * noise.next();
        writer
            .write_sample((v.clamp(-1.0, 1.0) * 32767.0) as i16)
            .expect("in-memory WAV");
    }
    writer.finalize().expect("in-memory WAV");
    cursor.into_inner()
}

/// The `IMAGE_W × IMAGE_H` photo-like PNG.
pub fn photo_like_png() -> Vec<u8> {
    let mut grain = Lcg(7);
    let (w, h) = (f64::from(IMAGE_W), f64::from(IMAGE_H));
    let img = image::RgbImage::from_fn(IMAGE_W, IMAGE_H, |x, y| {
        let (u, v) = (f64::from(x) / w, f64::from(y) / h);
        // A sky-to-ground gradient, two soft blobs and a horizon edge.
        let blob = |cx: f64, cy: f64, r: f64| (-((u - cx).powi(2) + (v - cy).powi(2)) / r).exp();
        let horizon = 1.0 / (1.0 + (-(v - 0.6) * 60.0).exp());
        let base = [
            90.0 + 80.0 * (1.0 - v) + 60.0 * blob(0.3, 0.35, 0.02),
            120.0 + 60.0 * (1.0 - v) + 50.0 * blob(0.7, 0.5, 0.05) - 40.0 * horizon,
            200.0 - 120.0 * v - 80.0 * horizon + 30.0 * blob(0.5, 0.8, 0.03),
        ];
        image::Rgb(base.map(|c| (c + 12.0 * grain.next()).clamp(0.0, 255.0) as u8))
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .expect("in-memory PNG");
    out.into_inner()
}
