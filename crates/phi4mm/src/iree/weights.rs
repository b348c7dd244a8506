//! Weights as module arguments: declared in their stored precision (bf16 stays bf16, widened to
//! f32 inside the module), as stored or in tiles ([`super::tiles`]), recorded in order as the
//! module's weight schema, and uploaded once to resident device buffers that every call reuses.

use std::borrow::Cow;

use eerie::runtime::{self, Runtime, RuntimeError};
use half::slice::HalfBitsSliceExt;

use crate::checkpoint::store::DType as StoredDType;
use crate::checkpoint::{TensorView, WeightData};
use artifact_cache::WeightSpec;

use super::mlir::{DType, Func, Products, TensorType, Value};
use super::tiles::{tile_rows, tiled_shape, TileShape, TiledWeight};

/// How a weight lies in its device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Stored,
    /// In tiles of this many rows.
    Tiles(usize),
}

/// The weight arguments of one module, in declaration order.
#[derive(Default, Clone)]
pub struct Weights {
    views: Vec<(TensorView, Layout)>,
    pub specs: Vec<WeightSpec>,
}

impl Weights {
    /// Declares `t` as the next argument of `f` and returns it widened to f32.
    ///
    /// Arguments are declared in the same order in every function of a module, so one uploaded
    /// list serves all of them.
    pub fn arg(&mut self, f: &mut Func, name: &str, t: &TensorView) -> Value {
        let v = self.declare(f, name, t, Layout::Stored);
        f.convert(&v, DType::F32)
    }

    /// Declares the matrix `t` (`[n, k]`) as the next argument of `f`, in tiles
    /// ([`super::tiles`]) and its stored precision; [`Weights::upload`] packs it.
    fn tiled(&mut self, f: &mut Func, name: &str, t: &TensorView, shape: TileShape) -> TiledWeight {
        TiledWeight {
            tiles: self.declare(f, name, t, Layout::Tiles(shape.weight_rows)),
            n: t.shape[0],
        }
    }

    /// Declares the matrix `t` (`[n, …]`, read as `[n, k]`: a convolution kernel flattened)
    /// for products `x · tᵀ`: in tiles where `f` writes [`Products::Tiles`], else as stored.
    pub fn matrix(&mut self, f: &mut Func, name: &str, t: &TensorView) -> Matrix {
        match f.products() {
            Products::Tiles(shape) => Matrix::Tiled(self.tiled(f, name, t, shape)),
            _ => Matrix::Stored(self.arg(f, name, t)),
        }
    }

    fn declare(&mut self, f: &mut Func, name: &str, t: &TensorView, layout: Layout) -> Value {
        let dtype = match t.dtype {
            StoredDType::BF16 => DType::Bf16,
            StoredDType::F16 => DType::F16,
            StoredDType::F32 => DType::F32,
        };
        let shape = match layout {
            Layout::Stored => t.shape.clone(),
            Layout::Tiles(rows) => tiled_shape(&t.shape, rows),
        };
        let v = f.arg(TensorType::new(&shape, dtype));
        match self.specs.iter().position(|s| s.name == name) {
            Some(i) => assert_eq!(self.views[i].1, layout, "{name} in two layouts"),
            None => {
                self.specs.push(WeightSpec {
                    name: name.to_string(),
                    dtype: dtype.mlir().to_string(),
                    shape,
                });
                self.views.push((t.clone(), layout));
            }
        }
        v
    }

    /// Uploads every weight to `rt`'s device, in schema order; weights in tiles are packed on
    /// the way (one weight's copy at a time).
    pub fn upload(&self, rt: &Runtime) -> Result<Vec<runtime::Value>, RuntimeError> {
        self.views
            .iter()
            .zip(&self.specs)
            .map(|((t, layout), spec)| {
                let shape = &spec.shape;
                let (n, k) = (t.shape[0], t.shape[1..].iter().product());
                Ok(match t.data() {
                    WeightData::Bf16(s) => rt
                        .buffer_view(
                            shape,
                            in_layout(s, *layout, n, k).reinterpret_cast::<half::bf16>(),
                        )?
                        .into(),
                    WeightData::F16(s) => rt
                        .buffer_view(
                            shape,
                            in_layout(s, *layout, n, k).reinterpret_cast::<half::f16>(),
                        )?
                        .into(),
                    WeightData::F32(s) => {
                        rt.buffer_view(shape, &in_layout(s, *layout, n, k))?.into()
                    }
                })
            })
            .collect()
    }
}

/// The elements of a `[n, k]` weight as `layout` lays them out.
fn in_layout<T: Copy + Default + Send + Sync>(
    s: &[T],
    layout: Layout,
    n: usize,
    k: usize,
) -> Cow<'_, [T]> {
    match layout {
        Layout::Stored => Cow::Borrowed(s),
        Layout::Tiles(rows) => Cow::Owned(tile_rows(s, n, k, rows)),
    }
}

/// A weight that products read as `x · wᵀ` ([`Weights::matrix`]).
pub enum Matrix {
    /// As stored, widened to f32.
    Stored(Value),
    Tiled(TiledWeight),
}

impl Matrix {
    /// `if_true` where the scalar `pred` holds, else `if_false`, chosen before the product, so
    /// that only the chosen weight's product runs (the choice copies one weight; the product
    /// reads it again).
    pub fn choose(f: &mut Func, pred: &Value, if_true: &Matrix, if_false: &Matrix) -> Matrix {
        match (if_true, if_false) {
            (Matrix::Stored(a), Matrix::Stored(b)) => Matrix::Stored(f.select(pred, a, b)),
            (Matrix::Tiled(a), Matrix::Tiled(b)) => {
                assert_eq!(
                    a.n, b.n,
                    "choosing between weights of {} and {} rows",
                    a.n, b.n
                );
                Matrix::Tiled(TiledWeight {
                    tiles: f.select(pred, &a.tiles, &b.tiles),
                    n: a.n,
                })
            }
            _ => panic!("choosing between a stored and a tiled weight"),
        }
    }

    /// `x · wᵀ` for `x` `[…, k]`.
    pub fn product(&self, f: &mut Func, x: &Value) -> Value {
        match self {
            Matrix::Stored(w) if w.ty.rank() == 2 => f.linear_t(x, w),
            Matrix::Stored(w) => {
                let n = w.dim(0);
                let w = f.reshape(w, &[n, w.ty.numel() / n]);
                f.linear_t(x, &w)
            }
            Matrix::Tiled(w) => f.linear_tiled(x, w),
        }
    }
}
