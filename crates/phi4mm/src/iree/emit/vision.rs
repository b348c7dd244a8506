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
//! encoder); the embedding lookup itself is an exact one-hot contraction in-graph.

use crate::checkpoint::schema::VISION_PREFIX;
use crate::checkpoint::{Checkpoint, VisionConfig};

use crate::iree::mlir::{self, Comparison, DType, Func, Reduce, TensorType, Value};
use crate::iree::weights::Weights;

/// Rows per `project` call.
pub const PROJECT_ROWS: usize = 256;

/// Emitted module text and its weight schema.
pub struct VisionModule {
    pub mlir: String,
    pub weights: Weights,
}

struct LinearW {
    w: Value,
    b: Value,
}

struct LayerW {
    ln1: (Value, Value),
    ln2: (Value, Value),
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
    let mut t = |f: &mut Func, name: &str| w.arg(f, name, ck.tensor(name));
    let mut lin = |f: &mut Func, prefix: &str| LinearW {
        w: t(f, &format!("{prefix}.weight")),
        b: t(f, &format!("{prefix}.bias")),
    };
    let patch = lin(f, &format!("{ip}embeddings.patch_embedding"));
    let layers = (0..c.layers_used())
        .map(|i| {
            let p = format!("{ip}encoder.layers.{i}.");
            let ln1 = lin(f, &format!("{p}layer_norm1"));
            let ln2 = lin(f, &format!("{p}layer_norm2"));
            LayerW {
                ln1: (ln1.w, ln1.b),
                ln2: (ln2.w, ln2.b),
                q: lin(f, &format!("{p}self_attn.q_proj")),
                k: lin(f, &format!("{p}self_attn.k_proj")),
                v: lin(f, &format!("{p}self_attn.v_proj")),
                out: lin(f, &format!("{p}self_attn.out_proj")),
                fc1: lin(f, &format!("{p}mlp.fc1")),
                fc2: lin(f, &format!("{p}mlp.fc2")),
            }
        })
        .collect();
    let proj_up = lin(f, &format!("{VISION_PREFIX}img_projection_up"));
    let proj_down = lin(f, &format!("{VISION_PREFIX}img_projection_down"));
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

/// `x · Wᵀ + b`; `W` may be a conv kernel `[out, …]`, flattened to `[out, in]` like the host's
/// `Matrix::of`.
fn linear(f: &mut Func, x: &Value, l: &LinearW) -> Value {
    let out = l.w.dim(0);
    let w = if l.w.ty.rank() == 2 {
        l.w.clone()
    } else {
        f.reshape(&l.w, &[out, l.w.ty.numel() / out])
    };
    let y = f.linear_t(x, &w);
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
fn emit_main(ck: &Checkpoint, weights: &mut Weights) -> Func {
    let c = &ck.config.vision;
    let (grid, ps, ch, size) = (c.grid(), c.patch_size, c.num_channels, c.image_size);
    let np = grid * grid;
    let mut f = Func::new("main");
    let w = declare(&mut f, weights, ck);
    let pixels = f.arg(TensorType::f32(&[1, ch, size, size]));
    let ids = f.arg(TensorType::i32(&[np]));
    let mask = f.arg(TensorType::f32(&[np]));

    // im2col: patch (pr, pc) flattened as (channel, ky, kx), the conv kernel's layout.
    let x = f.reshape(&pixels, &[ch, grid, ps, grid, ps]);
    let x = f.transpose(&x, &[1, 3, 0, 2, 4]);
    let x = f.reshape(&x, &[np, ch * ps * ps]);
    let x = linear(&mut f, &x, &w.patch);

    // Position embeddings by an exact one-hot contraction (one 1.0 per row, the rest 0.0).
    let npos = w.position.dim(0);
    let oh_shape = [np, npos];
    let col = f.iota(&oh_shape, 1, DType::I32);
    let ids_b = f.broadcast(&ids, &oh_shape, &[0]);
    let hit = f.compare(&col, &ids_b, Comparison::Eq);
    let one = f.splat(1.0, &oh_shape);
    let zero = f.splat(0.0, &oh_shape);
    let onehot = f.select(&hit, &one, &zero);
    let pos = f.dot_general(&onehot, &w.position, (&[], &[]), (&[1], &[0]));
    let mut x = f.add(&x, &pos);

    let half = f.splat(0.5, &[np]);
    let valid = f.compare(&mask, &half, Comparison::Gt);
    let eps = c.layer_norm_eps;
    for l in &w.layers {
        let h = f.layer_norm(&x, &l.ln1.0, &l.ln1.1, eps);
        let a = attention(&mut f, l, &h, &valid, c);
        let o = linear(&mut f, &a, &l.out);
        x = f.add(&x, &o);
        let h = f.layer_norm(&x, &l.ln2.0, &l.ln2.1, eps);
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
fn emit_project(ck: &Checkpoint, weights: &mut Weights) -> Func {
    let c = &ck.config.vision;
    let mut f = Func::new("project");
    let w = declare(&mut f, weights, ck);
    let rows = f.arg(TensorType::f32(&[PROJECT_ROWS, c.hidden_size]));
    let up = linear(&mut f, &rows, &w.proj_up);
    let act = f.gelu_erf(&up);
    let down = linear(&mut f, &act, &w.proj_down);
    f.ret(vec![down]);
    f
}

pub fn emit(ck: &Checkpoint) -> VisionModule {
    let mut weights = Weights::default();
    let main = emit_main(ck, &mut weights);
    let project = emit_project(ck, &mut weights);
    VisionModule {
        mlir: mlir::module("vision", &[main, project]),
        weights,
    }
}
