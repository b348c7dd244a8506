//! Weights as module arguments: declared in their stored precision (bf16 stays bf16, widened to
//! f32 inside the module), recorded in order as the module's weight schema, and uploaded once to
//! resident device buffers that every call reuses.

use eerie::runtime::{self, Runtime, RuntimeError};
use half::slice::HalfBitsSliceExt;

use crate::checkpoint::store::DType as StoredDType;
use crate::checkpoint::{TensorView, WeightData};
use artifact_cache::WeightSpec;

use super::mlir::{DType, Func, TensorType, Value};

/// The weight arguments of one module, in declaration order.
#[derive(Default, Clone)]
pub struct Weights {
    pub views: Vec<TensorView>,
    pub specs: Vec<WeightSpec>,
}

impl Weights {
    /// Declares `t` as the next argument of `f` and returns it widened to f32.
    ///
    /// Arguments are declared in the same order in every function of a module, so one uploaded
    /// list serves all of them; `index` says where this weight sits in that list.
    pub fn arg(&mut self, f: &mut Func, name: &str, t: &TensorView) -> Value {
        let dtype = match t.dtype {
            StoredDType::BF16 => DType::Bf16,
            StoredDType::F16 => DType::F16,
            StoredDType::F32 => DType::F32,
        };
        let v = f.arg(TensorType::new(&t.shape, dtype));
        if !self.specs.iter().any(|s| s.name == name) {
            self.specs.push(WeightSpec {
                name: name.to_string(),
                dtype: dtype.mlir().to_string(),
                shape: t.shape.clone(),
            });
            self.views.push(t.clone());
        }
        f.convert(&v, DType::F32)
    }

    /// Uploads every weight to `rt`'s device, in schema order.
    pub fn upload(&self, rt: &Runtime) -> Result<Vec<runtime::Value>, RuntimeError> {
        self.views
            .iter()
            .map(|t| {
                Ok(match t.data() {
                    WeightData::Bf16(s) => rt
                        .buffer_view(&t.shape, s.reinterpret_cast::<half::bf16>())?
                        .into(),
                    WeightData::F16(s) => rt
                        .buffer_view(&t.shape, s.reinterpret_cast::<half::f16>())?
                        .into(),
                    WeightData::F32(s) => rt.buffer_view(&t.shape, s)?.into(),
                })
            })
            .collect()
    }
}
