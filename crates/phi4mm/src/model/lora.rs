//! Linear layers with optional LoRA adapters applied per batch row: `y = W x + scale · B (A x)`
//! only for the rows whose adapter mode selects that adapter. Base weights are never modified and
//! rows without an adapter pay nothing.

use crate::adapter::AdapterMode;
use crate::checkpoint::{Checkpoint, LoraAdapter, TensorView};

use crate::kernels::linear::{linear, linear_add_rows, linear_new, Matrix};

pub struct LoraPair {
    pub a: TensorView,
    pub b: TensorView,
    pub scale: f32,
}

pub struct LoraLinear {
    pub base: TensorView,
    pub speech: Option<LoraPair>,
    pub vision: Option<LoraPair>,
}

impl LoraLinear {
    pub fn load(ck: &Checkpoint, layer: usize, module: &str) -> Self {
        let pair = |adapter: LoraAdapter| {
            let cfg = ck.config.lora(adapter)?;
            let (a, b) = ck.lora(layer, module, adapter)?;
            Some(LoraPair {
                a: a.clone(),
                b: b.clone(),
                scale: cfg.scale(),
            })
        };
        LoraLinear {
            base: ck
                .tensor(&format!("model.layers.{layer}.{module}.weight"))
                .clone(),
            speech: pair(LoraAdapter::Speech),
            vision: pair(LoraAdapter::Vision),
        }
    }

    pub fn out_dim(&self) -> usize {
        self.base.shape[0]
    }

    /// `x` is `[tokens, in]`; `token_modes[t]` is the adapter mode of the row token `t` belongs to.
    pub fn forward(&self, x: &[f32], token_modes: &[AdapterMode]) -> Vec<f32> {
        let n = token_modes.len();
        let w = Matrix::of(&self.base);
        let mut y = linear_new(x, n, w, None);
        for (mode, pair) in [
            (AdapterMode::Speech, &self.speech),
            (AdapterMode::Vision, &self.vision),
        ] {
            let idx: Vec<usize> = (0..n).filter(|&t| token_modes[t] == mode).collect();
            if idx.is_empty() {
                continue;
            }
            let pair = pair.as_ref().unwrap_or_else(|| {
                panic!(
                    "adapter {mode:?} requested but the checkpoint has none (checked at admission)"
                )
            });
            let din = w.in_dim;
            // One pass over A and one over B for all of this adapter's rows: gather the rows
            // (contiguous runs still copy, small next to the products), `A x` into a small
            // buffer, then `scale · B (A x)` added straight into the base output.
            let mut xs = Vec::with_capacity(idx.len() * din);
            for &t in &idx {
                xs.extend_from_slice(&x[t * din..(t + 1) * din]);
            }
            let r = pair.a.shape[0];
            let mut ax = vec![0.0; idx.len() * r];
            linear(&xs, idx.len(), Matrix::of(&pair.a), None, &mut ax);
            linear_add_rows(&ax, Matrix::of(&pair.b), pair.scale, &mut y, &idx);
        }
        y
    }
}
