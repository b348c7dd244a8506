//! The filtered view of the checkpoint that MLX loads: the text-embedding table and the vision
//! tower with its separators and projector. No decoder or audio tensor is ever copied to MLX.

use std::collections::BTreeMap;

use half::slice::HalfBitsSliceExt;
use mlx_rs::Array;

use crate::checkpoint::schema::VISION_PREFIX;
use crate::checkpoint::{Checkpoint, TensorView, WeightData};

use super::MlxError;

/// The one text tensor MLX reads.
pub const EMBED_TABLE: &str = "model.embed_tokens.weight";

/// Whether MLX loads the tensor `name`: the embedding table and everything under the vision
/// prefix.
pub fn in_view(name: &str) -> bool {
    name == EMBED_TABLE || name.starts_with(VISION_PREFIX)
}

/// The filtered tensors as MLX arrays, in their stored precision.
pub struct MlxWeights {
    tensors: BTreeMap<String, Array>,
}

impl MlxWeights {
    pub fn load(ck: &Checkpoint) -> Self {
        let tensors = ck
            .tensor_names()
            .filter(|name| in_view(name))
            .map(|name| (name.to_owned(), to_array(ck.tensor(name))))
            .collect();
        MlxWeights { tensors }
    }

    /// Names of the tensors MLX holds (for tests: the view really is filtered).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensor `name`, in its stored precision.
    pub fn get(&self, name: &str) -> Result<&Array, MlxError> {
        self.tensors
            .get(name)
            .ok_or_else(|| MlxError::Start(format!("the checkpoint view has no tensor {name}")))
    }

    /// The tensor `name` widened to f32 (widening is exact, so MLX computes on the same values as
    /// the host).
    pub fn f32(&self, name: &str) -> Result<Array, MlxError> {
        Ok(self.get(name)?.as_type::<f32>()?)
    }
}

fn to_array(t: &TensorView) -> Array {
    let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
    match t.data() {
        WeightData::F32(s) => Array::from_slice(s, &shape),
        WeightData::Bf16(s) => Array::from_slice(s.reinterpret_cast::<half::bf16>(), &shape),
        WeightData::F16(s) => Array::from_slice(s.reinterpret_cast::<half::f16>(), &shape),
    }
}
