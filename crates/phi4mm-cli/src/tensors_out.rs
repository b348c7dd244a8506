//! Writing the front-end subcommands' outputs as safetensors.

use anyhow::Context;
use safetensors::{tensor::TensorView, Dtype};
use std::path::Path;

/// One output tensor: name, dtype, shape and little-endian bytes.
pub struct Out {
    pub name: &'static str,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl Out {
    pub fn f32(name: &'static str, shape: Vec<usize>, values: &[f32]) -> Self {
        Self {
            name,
            dtype: Dtype::F32,
            shape,
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
    pub fn i64(name: &'static str, shape: Vec<usize>, values: &[i64]) -> Self {
        Self {
            name,
            dtype: Dtype::I64,
            shape,
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
    pub fn u8(name: &'static str, shape: Vec<usize>, values: Vec<u8>) -> Self {
        Self {
            name,
            dtype: Dtype::U8,
            shape,
            bytes: values,
        }
    }
}

/// Writes all tensors to `path`.
pub fn write(path: &Path, tensors: &[Out]) -> anyhow::Result<()> {
    let views = tensors
        .iter()
        .map(|t| Ok((t.name, TensorView::new(t.dtype, t.shape.clone(), &t.bytes)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
        .context("building tensor views")?;
    // safetensors' I/O error prints its cause and also hands it on as its source: as a context
    // it would print the cause twice.
    safetensors::tensor::serialize_to_file(views, None, path)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}
