//! The Conformer audio encoder as StableHLO, module `audio`, two kinds of function:
//!
//! - `subsample_r{R}`: normalisation and the NeMo dw-striding subsampler over a fixed chunk of
//!   `(R + 2)·8` feature frames → `R + 2` encoder rows, of which the caller keeps rows `1..=R`,
//!   for each `R` in [`SUB_ROWS`]. The subsampler is local (output row r sees frames 8r−7 …
//!   8r+7, and every intermediate position in that cone lies inside the chunk), so with one row
//!   of halo on each side a clip of any length is cut into chunks whose kept rows equal the
//!   host's whole-clip subsampling exactly. The host zero-pads each conv stage at the clip's true
//!   edges; here each stage's output is masked to its valid range `[lo_k, hi_k)`
//!   (chunk-relative, runtime input), which reproduces that padding wherever the chunk touches
//!   the clip start or end.
//! - `window_w{W}`: the Conformer blocks over one attention window of a static `W` rows plus the
//!   selected audio projection. The host runs windows of exactly `t` rows when `t ≤ 500` and
//!   zero-padded windows of 500 (all rows attending) otherwise; here keys at or past the runtime
//!   `valid` length are masked, so a short clip in a larger bucket attends over exactly its own
//!   `t` rows (the depthwise conv is causal, so padded rows never reach valid ones), and long-clip
//!   windows run with `valid = 500`. Both projection branches are computed and the runtime `mode`
//!   picks one, so one compiled function serves speech and vision requests.
//!
//! Every function declares every weight, in the same order, so one uploaded list serves all.

use crate::checkpoint::schema::AUDIO_PREFIX;
use crate::checkpoint::{AudioConfig, Checkpoint};

use crate::iree::mlir::{self, BinaryOp, Comparison, DType, Func, Products, TensorType, Value};
use crate::iree::weights::{Matrix, Weights};

/// Encoder rows one `subsample_r{R}` call produces for the caller (plus one halo row on each
/// side): a small chunk and a large one. Every call packs the subsampler's weights for IREE's
/// micro-kernels (the 1024 × 10240 output weight alone took 20–26 ms at real dimensions), so a
/// long clip goes in large chunks ([`sub_chunk`]): a 30 s clip (375 rows) is one call of 384
/// instead of three of 128, 742–751 ms against 783–827 for the whole encoder
/// (`docs/benchmarks.md`).
pub const SUB_ROWS: [usize; 2] = [128, 384];

/// The chunk the subsampler takes next with `remaining` rows left: the large one while it saves
/// calls (more than two small chunks' worth), else the small one, so a short clip does not pay
/// for a large chunk's padding.
pub fn sub_chunk(remaining: usize) -> usize {
    let [small, large] = SUB_ROWS;
    if remaining > 2 * small {
        large
    } else {
        small
    }
}

/// Rows between window buckets. A clip of `t` rows that fits one window runs in the smallest
/// bucket that holds it, so the padding it computes is under one step: a 30 s clip (375 rows)
/// runs in 384 rows, not the full window's 500 (33% more rows through every product, 78% more
/// attention). Each bucket is a copy of the whole Conformer in the module, so each step costs
/// compile time: at the released dimensions the module took 50 s to compile with these eight
/// buckets, against 15 s with two (`docs/benchmarks.md`).
pub const WINDOW_STEP: usize = 64;

/// Window buckets for the reference window `win` (`max_seq_len_window`): every multiple of
/// [`WINDOW_STEP`] below it, then the window itself.
pub fn window_buckets(win: usize) -> Vec<usize> {
    let mut b: Vec<usize> = (WINDOW_STEP..win).step_by(WINDOW_STEP).collect();
    b.push(win);
    b
}

/// Emitted module text and its weight schema.
pub struct AudioModule {
    pub mlir: String,
    pub weights: Weights,
}

/// A weight and bias as stored (convolution kernels keep their rank).
struct Lin {
    w: Value,
    b: Value,
}

/// A biased linear layer, its weight declared for products ([`Weights::matrix`]).
struct Linear {
    w: Matrix,
    b: Value,
}

struct LnW {
    w: Value,
    b: Value,
}

struct FfW {
    norm: LnW,
    up: Linear,
    down: Linear,
}

struct BlockW {
    ff_in: FfW,
    ff_out: FfW,
    ln_att: LnW,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    conv_norm: LnW,
    glu_pw: Linear,
    b1: Value,
    b2: Value,
    dw_w: Value,
    dw_b: Value,
    pw: Linear,
    ext_pw: Linear,
    ln_out: LnW,
}

struct AudioW {
    mean: Value,
    invstd: Value,
    conv0: Lin,
    /// (depthwise, pointwise) per later stride-2 stage.
    stages: Vec<(Lin, Linear)>,
    embed_out: Linear,
    bias_values: Value,
    blocks: Vec<BlockW>,
    speech: (Linear, Linear),
    vision: (Linear, Linear),
}

/// Declares weights as arguments of one function, in a fixed order.
struct Decl<'a> {
    w: &'a mut Weights,
    ck: &'a Checkpoint,
}

impl Decl<'_> {
    fn t(&mut self, f: &mut Func, name: &str) -> Value {
        self.w.arg(f, name, self.ck.tensor(name))
    }

    /// A biased linear layer; pointwise conv weights `[out, in, 1(, 1)]` are read as
    /// `[out, in]`.
    fn lin(&mut self, f: &mut Func, p: &str) -> Linear {
        let name = format!("{p}.weight");
        Linear {
            w: self.w.matrix(f, &name, self.ck.tensor(&name)),
            b: self.t(f, &format!("{p}.bias")),
        }
    }

    /// Weight and bias as stored (conv kernels keep their rank).
    fn raw(&mut self, f: &mut Func, p: &str) -> Lin {
        Lin {
            w: self.t(f, &format!("{p}.weight")),
            b: self.t(f, &format!("{p}.bias")),
        }
    }

    fn ln(&mut self, f: &mut Func, p: &str) -> LnW {
        let l = self.raw(f, p);
        LnW { w: l.w, b: l.b }
    }

    fn ff(&mut self, f: &mut Func, p: &str) -> FfW {
        FfW {
            norm: self.ln(f, &format!("{p}.layer_norm")),
            up: self.lin(f, &format!("{p}.gate_up_proj")),
            down: self.lin(f, &format!("{p}.down_proj")),
        }
    }
}

fn declare(f: &mut Func, w: &mut Weights, ck: &Checkpoint) -> AudioW {
    let c = &ck.config.audio;
    let d = c.hidden_size;
    let ep = format!("{AUDIO_PREFIX}encoder.");
    let mut dc = Decl { w, ck };
    let mean = dc.t(f, &format!("{ep}encoder_embedding.global_mean"));
    let invstd = dc.t(f, &format!("{ep}encoder_embedding.global_invstd"));
    let conv0 = dc.raw(f, &format!("{ep}embed.conv.0"));
    let stages = (1..c.subsampling_stages())
        .map(|s| {
            (
                dc.raw(f, &format!("{ep}embed.conv.{}", 3 * s - 1)),
                dc.lin(f, &format!("{ep}embed.conv.{}", 3 * s)),
            )
        })
        .collect();
    let embed_out = dc.lin(f, &format!("{ep}embed.out"));
    let bias_values = dc.t(
        f,
        &format!("{ep}relative_attention_bias_layer.bias_values.weight"),
    );
    let blocks = (0..c.num_blocks)
        .map(|i| {
            let p = format!("{ep}encoders.{i}.");
            let ff_in = dc.ff(f, &format!("{p}feed_forward_in"));
            let ff_out = dc.ff(f, &format!("{p}feed_forward_out"));
            let ln_att = dc.ln(f, &format!("{p}layer_norm_att"));
            let q = dc.lin(f, &format!("{p}self_attn.q_proj"));
            let k = dc.lin(f, &format!("{p}self_attn.k_proj"));
            let v = dc.lin(f, &format!("{p}self_attn.v_proj"));
            let o = dc.lin(f, &format!("{p}self_attn.o_proj"));
            let conv_norm = dc.ln(f, &format!("{p}conv.layer_norm"));
            let glu_pw = dc.lin(f, &format!("{p}conv.glu.ext_pw_conv_1d"));
            let b1 = dc.t(f, &format!("{p}conv.glu.b1"));
            let b1 = f.reshape(&b1, &[d]);
            let b2 = dc.t(f, &format!("{p}conv.glu.b2"));
            let b2 = f.reshape(&b2, &[d]);
            let dw = dc.raw(f, &format!("{p}conv.dw_sep_conv_1d.dw_conv"));
            let pw = dc.lin(f, &format!("{p}conv.dw_sep_conv_1d.pw_conv"));
            let ext_pw = dc.lin(f, &format!("{p}conv.ext_pw_conv_1d"));
            let ln_out = dc.ln(f, &format!("{p}layer_norm"));
            BlockW {
                ff_in,
                ff_out,
                ln_att,
                q,
                k,
                v,
                o,
                conv_norm,
                glu_pw,
                b1,
                b2,
                dw_w: dw.w,
                dw_b: dw.b,
                pw,
                ext_pw,
                ln_out,
            }
        })
        .collect();
    let mut proj = |f: &mut Func, branch: &str| {
        (
            dc.lin(f, &format!("{AUDIO_PREFIX}up_proj_for_{branch}")),
            dc.lin(f, &format!("{AUDIO_PREFIX}down_proj_for_{branch}")),
        )
    };
    let speech = proj(f, "speech");
    let vision = proj(f, "vision_speech");
    AudioW {
        mean,
        invstd,
        conv0,
        stages,
        embed_out,
        bias_values,
        blocks,
        speech,
        vision,
    }
}

fn linear(f: &mut Func, x: &Value, l: &Linear) -> Value {
    let y = l.w.product(f, x);
    f.add(&y, &l.b)
}

fn relu(f: &mut Func, x: &Value) -> Value {
    let z = f.splat(0.0, x.shape());
    f.binary(BinaryOp::Max, x, &z)
}

/// Zeroes positions of dimension `dim` outside `[lo, hi)` (scalar i32 tensors).
fn mask_range(f: &mut Func, x: &Value, dim: usize, lo: &Value, hi: &Value) -> Value {
    let shape = x.shape().to_vec();
    let pos = f.iota(&shape, dim, DType::I32);
    let lo = f.broadcast(lo, &shape, &[]);
    let hi = f.broadcast(hi, &shape, &[]);
    let ge = f.compare(&pos, &lo, Comparison::Ge);
    let lt = f.compare(&pos, &hi, Comparison::Lt);
    let keep = f.binary(BinaryOp::And, &ge, &lt);
    let z = f.splat(0.0, &shape);
    f.select(&keep, x, &z)
}

/// Adds a per-channel bias to a tensor whose channels are dimension `channel`.
fn add_channel_bias(f: &mut Func, x: &Value, b: &Value, channel: usize) -> Value {
    let shape = x.shape().to_vec();
    let b = f.broadcast(b, &shape, &[channel]);
    f.add(x, &b)
}

/// `subsample_r{rows}(weights…, features [(rows+2)·8, input_size], bounds [2·(stages+1)] i32)
/// → [rows+2, hidden]`; `bounds` holds `lo_k, hi_k` per stage (k = 0 the input frames).
fn emit_subsample(ck: &Checkpoint, products: Products, rows: usize, w: &mut Weights) -> Func {
    let c = &ck.config.audio;
    let stages = c.subsampling_stages();
    let mut f = Func::new(&format!("subsample_r{rows}")).with_products(products);
    let aw = declare(&mut f, w, ck);
    let n = (rows + 2) * c.time_reduction;
    let fin = c.input_size;
    let x = f.arg(TensorType::f32(&[n, fin]));
    let bounds = f.arg(TensorType::i32(&[2 * (stages + 1)]));
    let lo: Vec<Value> = (0..=stages).map(|k| f.scalar_at(&bounds, 2 * k)).collect();
    let hi: Vec<Value> = (0..=stages)
        .map(|k| f.scalar_at(&bounds, 2 * k + 1))
        .collect();

    let x = f.sub(&x, &aw.mean);
    let x = f.mul(&x, &aw.invstd);
    let x = mask_range(&mut f, &x, 0, &lo[0], &hi[0]);
    // Channels last throughout, `[1, t, freq, channel]`: each pointwise convolution is then a
    // plain matrix product of `[t·freq, channel]` rows, with no transposes around it. (Alone this
    // measured no faster; the data-tiled compile of `Rows::Many` is what sped the module up.)
    let x = f.reshape(&x, &[1, n, fin, 1]);
    let y = f.conv(&x, &aw.conv0.w, &[2, 2], &[(1, 1), (1, 1)], 1);
    let y = add_channel_bias(&mut f, &y, &aw.conv0.b, 3);
    let y = relu(&mut f, &y);
    let mut x = mask_range(&mut f, &y, 1, &lo[1], &hi[1]);
    for (s, (dw, pw)) in aw.stages.iter().enumerate() {
        let ch = x.dim(3);
        let y = f.conv(&x, &dw.w, &[2, 2], &[(1, 1), (1, 1)], ch);
        let y = add_channel_bias(&mut f, &y, &dw.b, 3);
        let (t, fr) = (y.dim(1), y.dim(2));
        let rows = f.reshape(&y, &[t * fr, ch]);
        let z = linear(&mut f, &rows, pw);
        let z = f.reshape(&z, &[1, t, fr, z.dim(1)]);
        let z = relu(&mut f, &z);
        x = mask_range(&mut f, &z, 1, &lo[s + 2], &hi[s + 2]);
    }
    // Flatten channel-major (feature = channel · freq_len + freq), as the host does.
    let (t, fr, ch) = (x.dim(1), x.dim(2), x.dim(3));
    let x = f.reshape(&x, &[t, fr, ch]);
    let x = f.transpose(&x, &[0, 2, 1]);
    let x = f.reshape(&x, &[t, ch * fr]);
    let out = linear(&mut f, &x, &aw.embed_out);
    f.ret(vec![out]);
    f
}

/// T5 relative bias `[heads, w, w]`: `bias_values[clamp(j − i, −D, D−1) + D][h]`, gathered row
/// by row. (A one-hot contraction, exact too, costs `w² · 2D` multiply-adds and a one-hot of that
/// size: 250 million values for the real encoder's 500-row windows and D = 500.)
///
/// Every block adds the same bias, so it is gathered once, behind a barrier. Without it, IREE
/// fused the gather into the first block's scores and stored the bias from there as a second
/// result for the other blocks. At windows of 192–448 rows that dispatch needed 51–200 KiB of
/// stack, over the compiler's 32 KiB limit, and did not compile (the released model's 24 blocks;
/// with 2 it did).
fn relative_bias(f: &mut Func, bias_values: &Value, w: usize, dmax: usize) -> Value {
    let shape = [w, w];
    let i = f.iota(&shape, 0, DType::I32);
    let j = f.iota(&shape, 1, DType::I32);
    let r = f.sub(&j, &i);
    let lo = f.splat_i32(-(dmax as i32), &[]);
    let lo = f.broadcast(&lo, &shape, &[]);
    let hi = f.splat_i32(dmax as i32 - 1, &[]);
    let hi = f.broadcast(&hi, &shape, &[]);
    let r = f.binary(BinaryOp::Max, &r, &lo);
    let r = f.binary(BinaryOp::Min, &r, &hi);
    let off = f.splat_i32(dmax as i32, &[]);
    let off = f.broadcast(&off, &shape, &[]);
    let r = f.add(&r, &off);
    let bias = f.take_rows(bias_values, &r); // [w, w, heads]
    let bias = f.transpose(&bias, &[2, 0, 1]);
    f.barrier(&bias)
}

fn feed_forward(f: &mut Func, ff: &FfW, x: &Value, inter: usize) -> Value {
    let t = x.dim(0);
    let h = f.layer_norm(x, &ff.norm.w, &ff.norm.b, LN_EPS);
    let u = linear(f, &h, &ff.up);
    // [value | gate]: the first half is the value.
    let val = f.slice(&u, &[0, 0], &[t, inter]);
    let gate = f.slice(&u, &[0, inter], &[t, 2 * inter]);
    let g = f.silu(&gate);
    let act = f.mul(&val, &g);
    linear(f, &act, &ff.down)
}

const LN_EPS: f32 = 1e-5;

fn block(
    f: &mut Func,
    b: &BlockW,
    c: &AudioConfig,
    x: Value,
    bias: &Value,
    key_ok: &Value,
) -> Value {
    let (t, d) = (x.dim(0), x.dim(1));
    let ff = feed_forward(f, &b.ff_in, &x, c.intermediate_size);
    let ff = f.scale(&ff, 0.5);
    let mut x = f.add(&x, &ff);

    let h = f.layer_norm(&x, &b.ln_att.w, &b.ln_att.b, LN_EPS);
    let (nh, hd) = (c.num_heads, d / c.num_heads);
    let heads = |f: &mut Func, l: &Linear| {
        let y = linear(f, &h, l);
        let y = f.reshape(&y, &[t, nh, hd]);
        f.transpose(&y, &[1, 0, 2])
    };
    let q = heads(f, &b.q);
    let k = heads(f, &b.k);
    let v = heads(f, &b.v);
    let s = f.dot_general(&q, &k, (&[0], &[0]), (&[2], &[2])); // [nh, t, t]
    let s = f.scale(&s, (hd as f32).powf(-0.5));
    let s = f.add(&s, bias);
    let ninf = f.splat(f32::NEG_INFINITY, s.shape());
    let s = f.select(key_ok, &s, &ninf);
    let p = f.softmax_last(&s);
    let o = f.dot_general(&p, &v, (&[0], &[0]), (&[2], &[1])); // [nh, t, hd]
    let o = f.transpose(&o, &[1, 0, 2]);
    let o = f.reshape(&o, &[t, d]);
    let o = linear(f, &o, &b.o);
    x = f.add(&x, &o);

    // Conv module: GLU, causal depthwise conv (left zero padding), pointwise + swish, ext pw.
    let h = f.layer_norm(&x, &b.conv_norm.w, &b.conv_norm.b, LN_EPS);
    let g = linear(f, &h, &b.glu_pw);
    let a = f.slice(&g, &[0, 0], &[t, d]);
    let gb = f.slice(&g, &[0, d], &[t, 2 * d]);
    let a = f.add(&a, &b.b1);
    let gb = f.add(&gb, &b.b2);
    let gb = f.silu(&gb);
    let glu = f.mul(&a, &gb);
    let ks = c.kernel_size;
    // Channels last, `[1, t, d]`: the rows as they are, no transposes.
    let gt = f.reshape(&glu, &[1, t, d]);
    let dw = f.conv(&gt, &b.dw_w, &[1], &[(ks - 1, 0)], d);
    let dw = add_channel_bias(f, &dw, &b.dw_b, 2);
    let dw = f.reshape(&dw, &[t, d]);
    let p = linear(f, &dw, &b.pw);
    let p = f.silu(&p);
    let conv = linear(f, &p, &b.ext_pw);
    x = f.add(&x, &conv);

    let ff = feed_forward(f, &b.ff_out, &x, c.intermediate_size);
    let ff = f.scale(&ff, 0.5);
    let x = f.add(&x, &ff);
    f.layer_norm(&x, &b.ln_out.w, &b.ln_out.b, LN_EPS)
}

fn project(f: &mut Func, x: &Value, p: &(Linear, Linear)) -> Value {
    let h = linear(f, x, &p.0);
    let h = f.gelu_erf(&h);
    linear(f, &h, &p.1)
}

/// `window_w{W}(weights…, x [W, hidden], valid [1] i32, mode [1] i32 (0 speech, 1 vision))
/// → (encoder_out [W, hidden], projected [W, text_hidden])`.
fn emit_window(ck: &Checkpoint, products: Products, wlen: usize, w: &mut Weights) -> Func {
    let c = &ck.config.audio;
    let mut f = Func::new(&format!("window_w{wlen}")).with_products(products);
    let aw = declare(&mut f, w, ck);
    let d = c.hidden_size;
    let mut x = f.arg(TensorType::f32(&[wlen, d]));
    let valid = f.arg(TensorType::i32(&[1]));
    let mode = f.arg(TensorType::i32(&[1]));
    let bias = relative_bias(&mut f, &aw.bias_values, wlen, c.bias_max_distance);
    let shape = [c.num_heads, wlen, wlen];
    let key = f.iota(&shape, 2, DType::I32);
    let nv = f.scalar_at(&valid, 0);
    let nv = f.broadcast(&nv, &shape, &[]);
    let key_ok = f.compare(&key, &nv, Comparison::Lt);
    for b in &aw.blocks {
        x = block(&mut f, b, c, x, &bias, &key_ok);
    }
    // One projection per call: the mode's weights are chosen first, so the other branch's
    // products (2 × 9.7 GFLOP for a 384-row window at the released dimensions) never run.
    let m = f.scalar_at(&mode, 0);
    let one = f.splat_i32(1, &[]);
    let is_vision = f.compare(&m, &one, Comparison::Eq);
    let mut choose = |a: &Linear, b: &Linear| Linear {
        w: Matrix::choose(&mut f, &is_vision, &a.w, &b.w),
        b: f.select(&is_vision, &a.b, &b.b),
    };
    let chosen = (
        choose(&aw.vision.0, &aw.speech.0),
        choose(&aw.vision.1, &aw.speech.1),
    );
    let proj = project(&mut f, &x, &chosen);
    f.ret(vec![x, proj]);
    f
}

/// The whole audio module: one `subsample_r{R}` per chunk size and one `window_w{W}` per
/// bucket, its weights declared as `products` says (in tiles, or as stored).
pub fn emit(ck: &Checkpoint, products: Products) -> AudioModule {
    let mut w = Weights::default();
    let mut funcs: Vec<Func> = SUB_ROWS
        .iter()
        .map(|&rows| emit_subsample(ck, products, rows, &mut w))
        .collect();
    for wlen in window_buckets(ck.config.audio.max_seq_len_window) {
        funcs.push(emit_window(ck, products, wlen, &mut w));
    }
    AudioModule {
        mlir: mlir::module("audio", &funcs),
        weights: w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_buckets_step_by_64_and_end_at_the_window() {
        let released: Vec<usize> = vec![64, 128, 192, 256, 320, 384, 448, 500];
        assert_eq!(window_buckets(500), released);
        assert_eq!(window_buckets(512), [64, 128, 192, 256, 320, 384, 448, 512]);
        assert_eq!(window_buckets(100), [64, 100]);
        assert_eq!(window_buckets(64), [64]);
        assert_eq!(window_buckets(16), [16]);
    }
}
