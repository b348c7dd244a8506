//! Parameter holders shared by the audio and vision encoders: a biased linear layer whose weight
//! stays in its on-disk precision, and LayerNorm weights widened to f32.

use crate::checkpoint::{Checkpoint, TensorView};

use crate::kernels::linear::{linear_new, Matrix};

pub(super) struct Linear {
    pub(super) w: TensorView,
    pub(super) b: Vec<f32>,
}

impl Linear {
    pub(super) fn load(ck: &Checkpoint, prefix: &str) -> Self {
        Linear {
            w: ck.tensor(&format!("{prefix}.weight")).clone(),
            b: ck.tensor(&format!("{prefix}.bias")).to_f32_vec(),
        }
    }

    pub(super) fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        linear_new(x, rows, Matrix::of(&self.w), Some(&self.b))
    }
}

pub(super) struct Norm {
    pub(super) w: Vec<f32>,
    pub(super) b: Vec<f32>,
}

impl Norm {
    pub(super) fn load(ck: &Checkpoint, prefix: &str) -> Self {
        Norm {
            w: ck.tensor(&format!("{prefix}.weight")).to_f32_vec(),
            b: ck.tensor(&format!("{prefix}.bias")).to_f32_vec(),
        }
    }
}
