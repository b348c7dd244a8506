//! Shared helpers for the model tests: fixture paths, reference tensors, and model inputs built
//! from the fixture's precomputed features and preprocessed images.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use switchyard_phi4mm::model::{AdapterChoice, AdapterMode, AudioInput, ImageInput, PromptInput};

pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/phi4mm-tiny")
}

pub fn manifest() -> &'static Value {
    static M: OnceLock<Value> = OnceLock::new();
    M.get_or_init(|| {
        serde_json::from_str(&std::fs::read_to_string(fixture().join("manifest.json")).unwrap())
            .unwrap()
    })
}

/// A fixture safetensors file read into memory.
pub struct TensorFile(Vec<u8>);

impl TensorFile {
    pub fn open(name: &str) -> Self {
        TensorFile(std::fs::read(fixture().join(name)).unwrap())
    }

    fn view(&self, name: &str) -> (Dtype, Vec<usize>, Vec<u8>) {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("fixture tensor {name}"));
        (t.dtype(), t.shape().to_vec(), t.data().to_vec())
    }

    pub fn has(&self, name: &str) -> bool {
        SafeTensors::deserialize(&self.0)
            .unwrap()
            .tensor(name)
            .is_ok()
    }

    pub fn f32(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let (dt, shape, data) = self.view(name);
        assert_eq!(dt, Dtype::F32, "{name}");
        (
            data.chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            shape,
        )
    }

    pub fn i64(&self, name: &str) -> Vec<i64> {
        let (dt, _, data) = self.view(name);
        assert_eq!(dt, Dtype::I64, "{name}");
        data.chunks(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn u8(&self, name: &str) -> (Vec<u8>, Vec<usize>) {
        let (dt, shape, data) = self.view(name);
        assert_eq!(dt, Dtype::U8, "{name}");
        (data, shape)
    }
}

pub fn model_cases() -> &'static TensorFile {
    static F: OnceLock<TensorFile> = OnceLock::new();
    F.get_or_init(|| TensorFile::open("model_cases.safetensors"))
}

pub fn audio_features() -> &'static TensorFile {
    static F: OnceLock<TensorFile> = OnceLock::new();
    F.get_or_init(|| TensorFile::open("audio_features.safetensors"))
}

pub fn image_preprocessing() -> &'static TensorFile {
    static F: OnceLock<TensorFile> = OnceLock::new();
    F.get_or_init(|| TensorFile::open("image_preprocessing.safetensors"))
}

/// The fixture's log-mel features of a clip.
pub fn audio_input(clip: &str) -> AudioInput {
    let (features, shape) = audio_features().f32(&format!("{clip}.input_audio_embeds"));
    AudioInput {
        features,
        frames: shape[1],
    }
}

/// Pixel values rebuilt from the fixture's HD canvas (README section 8): normalise, cut tiles,
/// and bicubic-resize the whole canvas to one crop for the global image.
pub fn image_input(name: &str) -> ImageInput {
    let pre = image_preprocessing();
    let (hd, shape) = pre.u8(&format!("{name}.hd_image_uint8"));
    let (masks, mshape) = pre.u8(&format!("{name}.image_attention_mask"));
    let (h, w) = (shape[1], shape[2]);
    let x: Vec<f32> = hd.iter().map(|&u| (u as f32 - 127.5) / 127.5).collect();
    let s = 448;
    let (th, tw) = (h / s, w / s);
    let mut pixels = bicubic_resize(&x, 3, h, w, s, s);
    for i in 0..th {
        for j in 0..tw {
            for c in 0..3 {
                for r in 0..s {
                    let src = (c * h + i * s + r) * w + j * s;
                    pixels.extend_from_slice(&x[src..src + s]);
                }
            }
        }
    }
    ImageInput {
        pixel_values: pixels,
        patch_masks: masks,
        crops: mshape[0],
        canvas: [h, w],
    }
}

/// PyTorch `interpolate(mode="bicubic", align_corners=False)` without antialias, in f32.
pub fn bicubic_resize(x: &[f32], ch: usize, h: usize, w: usize, oh: usize, ow: usize) -> Vec<f32> {
    const A: f32 = -0.75;
    let c1 = |t: f32| ((A + 2.0) * t - (A + 3.0)) * t * t + 1.0;
    let c2 = |t: f32| ((A * t - 5.0 * A) * t + 8.0 * A) * t - 4.0 * A;
    let taps = |out: usize, inn: usize| -> Vec<([usize; 4], [f32; 4])> {
        let scale = inn as f32 / out as f32;
        (0..out)
            .map(|d| {
                let src = scale * (d as f32 + 0.5) - 0.5;
                let f = src.floor();
                let t = src - f;
                let i = f as isize;
                let idx = [i - 1, i, i + 1, i + 2].map(|k| k.clamp(0, inn as isize - 1) as usize);
                (idx, [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)])
            })
            .collect()
    };
    let ty = taps(oh, h);
    let tx = taps(ow, w);
    let mut out = vec![0.0; ch * oh * ow];
    for c in 0..ch {
        for (oy, (iy, wy)) in ty.iter().enumerate() {
            for (ox, (ix, wx)) in tx.iter().enumerate() {
                let mut acc = 0.0;
                for k in 0..4 {
                    let row = &x[(c * h + iy[k]) * w..];
                    let v = row[ix[0]] * wx[0]
                        + row[ix[1]] * wx[1]
                        + row[ix[2]] * wx[2]
                        + row[ix[3]] * wx[3];
                    acc += v * wy[k];
                }
                out[(c * oh + oy) * ow + ox] = acc;
            }
        }
    }
    out
}

/// `max |a - b|` with a shape check.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Asserts `|a - b| <= atol + rtol·|b|` elementwise.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f32);
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{what}: non-finite output"
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        // NaN counts as a failure: it is never "within" the tolerance.
        if excess.is_nan() || excess > worst.1 {
            worst = (i, excess);
        }
    }
    assert!(
        worst.1 <= 0.0,
        "{what}: index {} got {} want {} (max abs diff {})",
        worst.0,
        got[worst.0],
        want[worst.0],
        max_abs_diff(got, want)
    );
}

/// Builds the id-driven input of a case from its manifest entry and the fixture's media tensors.
pub fn case_input(case: &str) -> PromptInput {
    let m = &manifest()["model_cases"]["cases"][case];
    let ids = model_cases().i64(&format!("{case}.input_ids"));
    PromptInput {
        input_ids: ids.iter().map(|&i| i as u32).collect(),
        images: m["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| image_input(i["name"].as_str().unwrap()))
            .collect(),
        audios: m["audios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| audio_input(a.as_str().unwrap()))
            .collect(),
        adapter: AdapterChoice::Auto,
    }
}

/// The adapter a case names in the manifest.
pub fn case_adapter(case: &str) -> AdapterMode {
    match manifest()["model_cases"]["cases"][case]["adapter"]
        .as_str()
        .unwrap()
    {
        "__base__" => AdapterMode::None,
        "speech" => AdapterMode::Speech,
        "vision" => AdapterMode::Vision,
        other => panic!("adapter {other}"),
    }
}
