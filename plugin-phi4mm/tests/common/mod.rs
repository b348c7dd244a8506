//! Fixture access shared by the front-end tests. Reference values come only from the fixture.
#![allow(dead_code)]

use safetensors::SafeTensors;
use std::path::PathBuf;

pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/phi4mm-tiny")
}

pub fn read(rel: &str) -> Vec<u8> {
    std::fs::read(fixture().join(rel)).unwrap_or_else(|e| panic!("reading fixture {rel}: {e}"))
}

pub fn manifest() -> serde_json::Value {
    serde_json::from_slice(&read("manifest.json")).expect("manifest.json parses")
}

pub struct Tensors {
    bytes: Vec<u8>,
}

impl Tensors {
    pub fn open(rel: &str) -> Self {
        Self { bytes: read(rel) }
    }
    fn get(&self, name: &str) -> (Vec<usize>, Vec<u8>, safetensors::Dtype) {
        let st = SafeTensors::deserialize(&self.bytes).expect("safetensors parses");
        let t = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("tensor {name}: {e}"));
        (t.shape().to_vec(), t.data().to_vec(), t.dtype())
    }
    pub fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (shape, data, dtype) = self.get(name);
        assert_eq!(dtype, safetensors::Dtype::F32, "{name}");
        (
            shape,
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }
    pub fn i64(&self, name: &str) -> (Vec<usize>, Vec<i64>) {
        let (shape, data, dtype) = self.get(name);
        assert_eq!(dtype, safetensors::Dtype::I64, "{name}");
        (
            shape,
            data.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }
    pub fn u8(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let (shape, data, dtype) = self.get(name);
        assert_eq!(dtype, safetensors::Dtype::U8, "{name}");
        (shape, data)
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
