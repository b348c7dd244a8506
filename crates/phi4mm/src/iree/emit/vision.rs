//! The SigLIP vision tower as StableHLO: module `vision` with
//!
//! - `main`: one crop (`pixels [1, C, S, S]`, NaViT position ids `[grid²]` i32, key mask
//!   `[grid²]` f32 0/1) → the feature-layer output `[grid², hidden]` and its 2×2 average pooling
//!   `[(grid/2)², hidden]`;
//! - `project`: a fixed bucket of HD-layout rows `[PROJECT_ROWS, hidden]` → the image projection
//!   MLP `[PROJECT_ROWS, text_hidden]` (row-wise, so the caller pads the last bucket).
//!
//! One crop per call keeps the module static while images have any number of crops. Position
//! ids are plain index arithmetic on the mask and come from the host (the same helper as the host
//! encoder); the embedding lookup itself is a gather in-graph.

use crate::checkpoint::schema::VISION_PREFIX;
use crate::checkpoint::{Checkpoint, VisionConfig};

use crate::iree::mlir::{self, Comparison, Func, Products, Reduce, TensorType, Value};
use crate::iree::weights::{Matrix, Weights};

/// Rows per `project` call.
pub const PROJECT_ROWS: usize = 256;

/// Emitted module text and its weight schema.
pub struct VisionModule {
    pub mlir: String,
    pub weights: Weights,
}

struct LinearW {
    w: Matrix,
    b: Value,
}

struct NormW {
    w: Value,
    b: Value,
}

struct LayerW {
    ln1: NormW,
    ln2: NormW,
    q: LinearW,
    k: LinearW,
    v: LinearW,
    out: LinearW,
    fc1: LinearW,
    fc2: LinearW,
}

struct VisionW {
    patch: LinearW,
    position: Value,
    layers: Vec<LayerW>,
    proj_up: LinearW,
    proj_down: LinearW,
}

/// Declares every vision weight as an argument of `f`, in the module's fixed order (the same in
/// both functions, so one uploaded list serves both).
fn declare(f: &mut Func, w: &mut Weights, ck: &Checkpoint) -> VisionW {
    let c = &ck.config.vision;
    let ip = format!("{VISION_PREFIX}img_processor.");
    let lin = |f: &mut Func, w: &mut Weights, prefix: &str| {
        let (wn, bn) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let weight = w.matrix(f, &wn, ck.tensor(&wn));
        let b = w.arg(f, &bn, ck.tensor(&bn));
        LinearW { w: weight, b }
    };
    let norm = |f: &mut Func, w: &mut Weights, prefix: &str| {
        let (wn, bn) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let weight = w.arg(f, &wn, ck.tensor(&wn));
        let b = w.arg(f, &bn, ck.tensor(&bn));
        NormW { w: weight, b }
    };
    let patch = lin(f, w, &format!("{ip}embeddings.patch_embedding"));
    let layers = (0..c.layers_used())
        .map(|i| {
            let p = format!("{ip}encoder.layers.{i}.");
            LayerW {
                ln1: norm(f, w, &format!("{p}layer_norm1")),
                ln2: norm(f, w, &format!("{p}layer_norm2")),
                q: lin(f, w, &format!("{p}self_attn.q_proj")),
                k: lin(f, w, &format!("{p}self_attn.k_proj")),
                v: lin(f, w, &format!("{p}self_attn.v_proj")),
                out: lin(f, w, &format!("{p}self_attn.out_proj")),
                fc1: lin(f, w, &format!("{p}mlp.fc1")),
                fc2: lin(f, w, &format!("{p}mlp.fc2")),
            }
        })
        .collect();
    let proj_up = lin(f, w, &format!("{VISION_PREFIX}img_projection_up"));
    let proj_down = lin(f, w, &format!("{VISION_PREFIX}img_projection_down"));
    let position = w.arg(
        f,
        &format!("{ip}embeddings.position_embedding.weight"),
        ck.tensor(&format!("{ip}embeddings.position_embedding.weight")),
    );
    VisionW {
        patch,
        position,
        layers,
        proj_up,
        proj_down,
    }
}

/// `x · Wᵀ + b`; `W` may be a conv kernel `[out, …]`, read as `[out, in]` like the host's
/// `Matrix::of`.
fn linear(f: &mut Func, x: &Value, l: &LinearW) -> Value {
    let y = l.w.product(f, x);
    f.add(&y, &l.b)
}

/// Softmax over the last dimension that, like the host kernel, gives an all-zero row when every
/// entry is −∞ (a crop whose keys are all masked) instead of NaN: the max is clamped to a finite
/// value (so `exp(−∞ − m)` is 0) and the sum to the smallest normal (so the row divides to 0).
/// Neither clamp changes a row with at least one finite entry (its sum is ≥ 1).
fn softmax_masked(f: &mut Func, x: &Value) -> Value {
    let r = x.ty.rank();
    let m = f.reduce(x, &[r - 1], Reduce::Max);
    let lo = f.splat(f32::MIN, m.shape());
    let m = f.binary(mlir::BinaryOp::Max, &m, &lo);
    let e = f.exp_minus_rows(x, &m);
    let s = f.reduce(&e, &[r - 1], Reduce::Sum);
    let tiny = f.splat(f32::MIN_POSITIVE, s.shape());
    let s = f.binary(mlir::BinaryOp::Max, &s, &tiny);
    f.scale_rows_by_inverse(&e, &s)
}

/// Bidirectional multi-head attention over `h` `[n, hidden]`; keys with `valid` false get −∞
/// scores (the host's patch-mask semantics: masked patches are excluded as keys only).
fn attention(f: &mut Func, l: &LayerW, h: &Value, valid: &Value, c: &VisionConfig) -> Value {
    let n = h.dim(0);
    let (hid, nh) = (c.hidden_size, c.num_heads);
    let hd = hid / nh;
    let q = linear(f, h, &l.q);
    let k = linear(f, h, &l.k);
    let v = linear(f, h, &l.v);
    let q = f.reshape(&q, &[n, nh, hd]);
    let k = f.reshape(&k, &[n, nh, hd]);
    let v = f.reshape(&v, &[n, nh, hd]);
    let s = f.dot_general(&q, &k, (&[1], &[1]), (&[2], &[2])); // [nh, n, n]
    let s = f.scale(&s, (hd as f32).powf(-0.5));
    let shape = [nh, n, n];
    let valid = f.broadcast(valid, &shape, &[2]);
    let ninf = f.splat(f32::NEG_INFINITY, &shape);
    let s = f.select(&valid, &s, &ninf);
    let p = softmax_masked(f, &s);
    let o = f.dot_general(&p, &v, (&[0], &[1]), (&[2], &[0])); // [nh, n, hd]
    let o = f.transpose(&o, &[1, 0, 2]);
    f.reshape(&o, &[n, hid])
}

/// `main`: one crop through the tower, plus its 2×2 pooling.
fn emit_main(ck: &Checkpoint, products: Products, weights: &mut Weights) -> Func {
    let c = &ck.config.vision;
    let (grid, ps, ch, size) = (c.grid(), c.patch_size, c.num_channels, c.image_size);
    let np = grid * grid;
    let mut f = Func::new("main").with_products(products);
    let w = declare(&mut f, weights, ck);
    let pixels = f.arg(TensorType::f32(&[1, ch, size, size]));
    let ids = f.arg(TensorType::i32(&[np]));
    let mask = f.arg(TensorType::f32(&[np]));

    // im2col: patch (pr, pc) flattened as (channel, ky, kx), the conv kernel's layout.
    let x = f.reshape(&pixels, &[ch, grid, ps, grid, ps]);
    let x = f.transpose(&x, &[1, 3, 0, 2, 4]);
    let x = f.reshape(&x, &[np, ch * ps * ps]);
    let x = linear(&mut f, &x, &w.patch);

    // Position embeddings gathered by id: exact, where a one-hot contraction (as exact) was a
    // [patches, positions] × [positions, hidden] product, 6.8 ms of a 273 ms crop.
    let pos = f.take_rows(&w.position, &ids);
    let mut x = f.add(&x, &pos);

    let half = f.splat(0.5, &[np]);
    let valid = f.compare(&mask, &half, Comparison::Gt);
    let eps = c.layer_norm_eps;
    for l in &w.layers {
        let h = f.layer_norm(&x, &l.ln1.w, &l.ln1.b, eps);
        let a = attention(&mut f, l, &h, &valid, c);
        let o = linear(&mut f, &a, &l.out);
        x = f.add(&x, &o);
        let h = f.layer_norm(&x, &l.ln2.w, &l.ln2.b, eps);
        let h = linear(&mut f, &h, &l.fc1);
        let h = f.gelu_tanh(&h);
        let o = linear(&mut f, &h, &l.fc2);
        x = f.add(&x, &o);
    }

    // 2×2 average pooling: [grid, grid, hid] → [g, 2, g, 2, hid], summed over the 2s.
    let g = grid / 2;
    let hid = c.hidden_size;
    let p = f.reshape(&x, &[g, 2, g, 2, hid]);
    let p = f.reduce(&p, &[1, 3], Reduce::Sum);
    let p = f.scale(&p, 0.25);
    let p = f.reshape(&p, &[g * g, hid]);
    f.ret(vec![x, p]);
    f
}

/// `project`: the image projection MLP (`up`, exact GELU, `down`) over a bucket of rows.
fn emit_project(ck: &Checkpoint, products: Products, weights: &mut Weights) -> Func {
    let c = &ck.config.vision;
    let mut f = Func::new("project").with_products(products);
    let w = declare(&mut f, weights, ck);
    let rows = f.arg(TensorType::f32(&[PROJECT_ROWS, c.hidden_size]));
    let up = linear(&mut f, &rows, &w.proj_up);
    let act = f.gelu_erf(&up);
    let down = linear(&mut f, &act, &w.proj_down);
    f.ret(vec![down]);
    f
}

/// The module, its weights declared as `products` says (in tiles, or as stored).
pub fn emit(ck: &Checkpoint, products: Products) -> VisionModule {
    let mut weights = Weights::default();
    let main = emit_main(ck, products, &mut weights);
    let project = emit_project(ck, products, &mut weights);
    VisionModule {
        mlir: mlir::module("vision", &[main, project]),
        weights,
    }
}
