//! The text decoder as StableHLO: for each cache size S and set of adapters A, `prefill_s{S}_{A}`
//! (one row, a chunk of up to `chunk` tokens; `prefill_cache_s{S}_{A}` the same without logits,
//! for the chunks before a row's last) and `decode_b{B}_s{S}_{A}` (B rows, one token each), in
//! one module `decoder`.
//!
//! Shapes are static: every row's KV cache is a `[layers, kv_heads, S, head_dim]` pair of
//! arguments that are also the storage of the results that return them (`iree.abi.output`), so a
//! call writes its new keys and values into the row's own buffers and copies nothing else of the
//! cache; positions are runtime arguments, and keys past a row's position are
//! masked out. Attention reads all S positions of the cache, so a step costs what its size
//! costs: the sizes grow geometrically ([`DecoderShape::new`]) and a row moves to the next size
//! only when it outgrows its own, which keeps both its memory and its step cost within a constant
//! factor of its length, up to the checkpoint's `max_position_embeddings`. RoPE cos/sin come from the
//! host (they depend on the LongRoPE mode, which the host decides per row, exactly as the host
//! backend does). Per-row LoRA: each adapter's A and B run over all rows of the call, multiplied
//! by a per-row 0/1 mask, so rows choose their adapter at run time with no global adapter state.
//! An adapter no row uses would cost its products all the same, so each function exists once
//! per set of adapters ([`Adapters`]): text rows run the base weights alone.

use crate::adapter::AdapterMode;
use crate::checkpoint::{Checkpoint, LoraAdapter, TextConfig};

use crate::iree::mlir::{self, BinaryOp, Comparison, DType, Func, Products, TensorType, Value};
use crate::iree::weights::{Matrix, Weights};

/// Static sizes a decoder module is built for (part of its cache identity).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecoderShape {
    /// Cache sizes (KV positions per row), ascending; each has its own functions.
    pub buckets: Vec<usize>,
    /// Tokens per prefill call.
    pub chunk: usize,
    /// Decode batch sizes compiled (`decode_b{B}_s{S}` for each).
    pub batches: &'static [usize],
    /// How the products of several rows are written (chosen by the compile target).
    pub products: Products,
}

/// Positions of the smallest cache size (plus a chunk); below it a step costs the weights, not
/// attention.
const FIRST_BUCKET: usize = 512;
/// Each cache size holds this many times the positions of the one before: a row's cache is then
/// never more than this factor larger than its length needs, and a module for 131072 positions
/// has five sizes.
const BUCKET_GROWTH: usize = 4;

impl DecoderShape {
    /// Sizes for rows of up to `context` positions, prefilled `chunk` tokens per call. A prefill
    /// call writes a whole chunk, so each size is a power-of-two row length plus a chunk (a row
    /// of exactly 4096 or 32768 positions takes the size named for it), and the largest is
    /// `context + chunk`.
    pub fn new(context: usize, chunk: usize, batches: &'static [usize]) -> Self {
        let mut buckets = Vec::new();
        let mut rows = FIRST_BUCKET.max(chunk);
        // A size holding more than half the context would save little; the top one serves.
        while 2 * rows <= context {
            buckets.push(rows + chunk);
            rows *= BUCKET_GROWTH;
        }
        buckets.push(context + chunk);
        DecoderShape {
            buckets,
            chunk,
            batches,
            products: Products::default(),
        }
    }

    /// The same shape with its several-row products written as `products` says.
    pub fn with_products(mut self, products: Products) -> Self {
        self.products = products;
        self
    }

    /// Longest prompt + generated tokens a row can hold.
    pub fn context(&self) -> usize {
        self.buckets.last().expect("at least one size") - self.chunk
    }

    /// The smallest cache size that holds `positions`.
    pub fn bucket(&self, positions: usize) -> Option<usize> {
        self.buckets.iter().copied().find(|&s| s >= positions)
    }
}

/// The LoRA adapters one compiled function applies, each to the rows its mask selects.
///
/// Every adapter applied costs each projection two small products (and a decode step their
/// dispatches) whether or not a row uses it, far more than their share of the arithmetic: on
/// the benchmark checkpoint (8 layers, ranks 32 and 24; `phi4mm bench-batch --backend iree`),
/// text prompts prefill 1.1–1.2× as fast with the base weights alone (`docs/benchmarks.md`).
/// Each set is one more function per batch size and cache size to compile, though (every set
/// for every call: twice the decoder's cold compile), so a call of one row (every prefill
/// chunk, a batch-1 step) runs exactly its row's adapter, and a call of several rows runs the
/// base weights alone when all its rows are text, and both adapters otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Adapters {
    Base,
    Speech,
    Vision,
    /// Both adapters: several rows, not all of them text.
    Mixed,
}

impl Adapters {
    /// What a call runs with, given its rows' modes (one per row of the call, padding rows as
    /// text).
    pub fn for_call(modes: &[AdapterMode]) -> Self {
        match modes {
            [AdapterMode::Speech] => Adapters::Speech,
            [AdapterMode::Vision] => Adapters::Vision,
            _ if modes.iter().all(|&m| m == AdapterMode::None) => Adapters::Base,
            _ => Adapters::Mixed,
        }
    }

    /// The sets compiled for calls of `rows` rows: every value [`Adapters::for_call`] gives.
    pub fn compiled_for(rows: usize) -> &'static [Adapters] {
        if rows == 1 {
            &[Adapters::Base, Adapters::Speech, Adapters::Vision]
        } else {
            &[Adapters::Base, Adapters::Mixed]
        }
    }

    fn applies(self, adapter: LoraAdapter) -> bool {
        matches!(
            (self, adapter),
            (Adapters::Mixed, _)
                | (Adapters::Speech, LoraAdapter::Speech)
                | (Adapters::Vision, LoraAdapter::Vision)
        )
    }

    /// The suffix of the functions' names.
    pub fn as_str(self) -> &'static str {
        match self {
            Adapters::Base => "base",
            Adapters::Speech => "speech",
            Adapters::Vision => "vision",
            Adapters::Mixed => "mixed",
        }
    }
}

/// What one function of the module computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One row's chunk; `logits` for the row's last chunk.
    Prefill { logits: bool },
    /// `b` rows, one token each.
    Decode { b: usize },
}

/// One function of the module: what it computes, at which cache size, with which adapters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderFn {
    pub kind: Kind,
    pub size: usize,
    pub adapters: Adapters,
}

impl DecoderFn {
    pub fn name(&self) -> String {
        let (size, a) = (self.size, self.adapters.as_str());
        match self.kind {
            Kind::Prefill { logits: true } => format!("prefill_s{size}_{a}"),
            Kind::Prefill { logits: false } => format!("prefill_cache_s{size}_{a}"),
            Kind::Decode { b } => format!("decode_b{b}_s{size}_{a}"),
        }
    }
}

impl DecoderShape {
    /// Every function of the module, in its order: per cache size, the prefill functions, then
    /// the decode functions of each batch size, each once per set of adapters it may need.
    pub fn functions(&self) -> Vec<DecoderFn> {
        let prefill = [true, false].map(|logits| (Kind::Prefill { logits }, 1));
        let decode = self.batches.iter().map(|&b| (Kind::Decode { b }, b));
        let kinds: Vec<(Kind, usize)> = prefill.into_iter().chain(decode).collect();
        let mut out = Vec::new();
        for &size in &self.buckets {
            for &(kind, rows) in &kinds {
                out.extend(
                    Adapters::compiled_for(rows)
                        .iter()
                        .map(|&adapters| DecoderFn {
                            kind,
                            size,
                            adapters,
                        }),
                );
            }
        }
        out
    }
}

/// Emitted module text and its weight schema.
pub struct DecoderModule {
    pub mlir: String,
    pub weights: Weights,
}

struct LoraW {
    a: Value,
    b: Value,
    scale: f32,
}

struct ProjW {
    base: Matrix,
    speech: Option<LoraW>,
    vision: Option<LoraW>,
}

struct LayerW {
    input_norm: Value,
    post_norm: Value,
    qkv: ProjW,
    o: ProjW,
    gate_up: ProjW,
    down: ProjW,
}

struct DecoderW {
    layers: Vec<LayerW>,
    norm: Value,
    lm_head: Matrix,
}

/// Declares every weight as an argument of `f`, in the module's fixed order.
fn declare(f: &mut Func, w: &mut Weights, ck: &Checkpoint) -> DecoderW {
    let c = &ck.config.text;
    let proj = |f: &mut Func, w: &mut Weights, i: usize, module: &str| {
        let name = format!("model.layers.{i}.{module}.weight");
        let base = w.matrix(f, &name, ck.tensor(&name));
        let mut lora = |adapter: LoraAdapter| {
            let cfg = ck.config.lora(adapter)?;
            let (a, b) = ck.lora(i, module, adapter)?;
            let tag = adapter.as_str();
            Some(LoraW {
                a: w.arg(f, &format!("model.layers.{i}.{module}.lora_A.{tag}"), a),
                b: w.arg(f, &format!("model.layers.{i}.{module}.lora_B.{tag}"), b),
                scale: cfg.scale(),
            })
        };
        let speech = lora(LoraAdapter::Speech);
        let vision = lora(LoraAdapter::Vision);
        ProjW {
            base,
            speech,
            vision,
        }
    };
    let layers = (0..c.num_layers)
        .map(|i| {
            let n1 = format!("model.layers.{i}.input_layernorm.weight");
            let n2 = format!("model.layers.{i}.post_attention_layernorm.weight");
            LayerW {
                input_norm: w.arg(f, &n1, ck.tensor(&n1)),
                post_norm: w.arg(f, &n2, ck.tensor(&n2)),
                qkv: proj(f, w, i, "self_attn.qkv_proj"),
                o: proj(f, w, i, "self_attn.o_proj"),
                gate_up: proj(f, w, i, "mlp.gate_up_proj"),
                down: proj(f, w, i, "mlp.down_proj"),
            }
        })
        .collect();
    let norm = w.arg(f, "model.norm.weight", ck.tensor("model.norm.weight"));
    let head_name = if c.tie_word_embeddings {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    let lm_head = w.matrix(f, head_name, ck.tensor(head_name));
    DecoderW {
        layers,
        norm,
        lm_head,
    }
}

/// `x · Wᵀ` plus, for each adapter in `t.adapters`, `scale · (m ⊙ (x·Aᵀ))·Bᵀ`, `m` the per-row
/// mask of that adapter.
fn proj(f: &mut Func, x: &Value, p: &ProjW, t: &TokenInputs) -> Value {
    let mut y = p.base.product(f, x);
    let adapters = [
        (LoraAdapter::Speech, &p.speech, t.speech),
        (LoraAdapter::Vision, &p.vision, t.vision),
    ];
    for (adapter, lora, mask) in adapters {
        if !t.adapters.applies(adapter) {
            continue;
        }
        if let Some(l) = lora {
            let ax = f.linear_t(x, &l.a);
            let m = f.broadcast(mask, &ax.ty.shape.clone(), &[0]);
            let ax = f.mul(&ax, &m);
            let bax = f.linear_t(&ax, &l.b);
            let bax = f.scale(&bax, l.scale);
            y = f.add(&y, &bax);
        }
    }
    y
}

/// Rotates the first `rotary_dim` channels of every head: `x` `[n, heads, head_dim]`, cos/sin
/// `[n, rotary_dim/2]` (already scaled by the LongRoPE attention factor).
fn rope(f: &mut Func, x: &Value, cos: &Value, sin: &Value, c: &TextConfig) -> Value {
    let (n, heads, hd) = (x.dim(0), x.dim(1), x.dim(2));
    let half = c.rotary_dim / 2;
    let a = f.slice(x, &[0, 0, 0], &[n, heads, half]);
    let b = f.slice(x, &[0, 0, half], &[n, heads, 2 * half]);
    let shape = [n, heads, half];
    let cos = f.broadcast(cos, &shape, &[0, 2]);
    let sin = f.broadcast(sin, &shape, &[0, 2]);
    let ac = f.mul(&a, &cos);
    let bs = f.mul(&b, &sin);
    let ra = f.sub(&ac, &bs);
    let bc = f.mul(&b, &cos);
    let as_ = f.mul(&a, &sin);
    let rb = f.add(&bc, &as_);
    if 2 * half == hd {
        f.concat(&[&ra, &rb], 2)
    } else {
        let pass = f.slice(x, &[0, 0, 2 * half], &[n, heads, hd]);
        f.concat(&[&ra, &rb, &pass], 2)
    }
}

/// Causal GQA attention of one row's `n` new tokens (queries `[n, heads·hd]`, first at `pos0`)
/// against its cache `[kv_heads, capacity, hd]` (which already holds the new keys/values).
fn attention(f: &mut Func, q: &Value, k: &Value, v: &Value, pos0: &Value, c: &TextConfig) -> Value {
    let n = q.dim(0);
    let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
    let g = nh / nkv;
    let cap = k.dim(1);
    let q = f.reshape(q, &[n, nkv, g, hd]);
    let q = f.transpose(&q, &[1, 0, 2, 3]);
    let q = f.reshape(&q, &[nkv, n * g, hd]);
    let s = f.dot_general(&q, k, (&[0], &[0]), (&[2], &[2])); // [nkv, n·g, cap]
    let s = f.scale(&s, 1.0 / (hd as f32).sqrt());
    // Query i (position pos0 + i) sees keys 0..=pos0 + i.
    let s = f.reshape(&s, &[nkv, n, g, cap]);
    let shape = [nkv, n, g, cap];
    let key = f.iota(&shape, 3, DType::I32);
    let qi = f.iota(&shape, 1, DType::I32);
    let p0 = f.broadcast(pos0, &shape, &[]);
    let qpos = f.add(&qi, &p0);
    let visible = f.compare(&key, &qpos, Comparison::Le);
    let ninf = f.splat(f32::NEG_INFINITY, &shape);
    let s = f.select(&visible, &s, &ninf);
    let p = f.softmax_last(&s);
    let p = f.reshape(&p, &[nkv, n * g, cap]);
    let o = f.dot_general(&p, v, (&[0], &[0]), (&[2], &[1])); // [nkv, n·g, hd]
    let o = f.reshape(&o, &[nkv, n, g, hd]);
    let o = f.transpose(&o, &[1, 0, 2, 3]);
    f.reshape(&o, &[n, nh * hd])
}

/// Appends one row's new keys/values to its cache at layer `li` and attends over it.
fn cached_attention(
    f: &mut Func,
    li: usize,
    q: &Value,
    k: &Value,
    v: &Value,
    r: &mut RowArgs,
    c: &TextConfig,
) -> Value {
    let n = k.dim(0);
    let (nkv, hd) = (c.num_kv_heads, c.head_dim);
    let cap = r.k.dim(2);
    // The cache is head-major, so that attention reads each head's keys and values as one
    // contiguous [cap, hd] block: token-major, IREE transposed every layer's whole cache on
    // every call to bring the heads first. Only the new tokens' few rows are transposed here.
    let heads_first = |f: &mut Func, x: &Value| {
        let x = f.reshape(x, &[n, nkv, hd]);
        let x = f.transpose(&x, &[1, 0, 2]);
        f.reshape(&x, &[1, nkv, n, hd])
    };
    let kr = heads_first(f, k);
    let vr = heads_first(f, v);
    let l = f.splat_i32(li as i32, &[]);
    let zero = f.splat_i32(0, &[]);
    r.k = f.dynamic_update_slice(&r.k, &kr, &[&l, &zero, &r.pos0, &zero]);
    r.v = f.dynamic_update_slice(&r.v, &vr, &[&l, &zero, &r.pos0, &zero]);
    let kc = f.dynamic_slice(&r.k, &[&l, &zero, &zero, &zero], &[1, nkv, cap, hd]);
    let vc = f.dynamic_slice(&r.v, &[&l, &zero, &zero, &zero], &[1, nkv, cap, hd]);
    let kc = f.reshape(&kc, &[nkv, cap, hd]);
    let vc = f.reshape(&vc, &[nkv, cap, hd]);
    attention(f, q, &kc, &vc, &r.pos0, c)
}

/// Per-row inputs of one function.
struct RowArgs {
    /// `[n, hidden]` for this row.
    x_rows: (usize, usize),
    pos0: Value,
    k: Value,
    v: Value,
}

/// The layer stack over `x` `[rows, hidden]` whose rows belong to `row_args` (contiguous
/// ranges); returns the final hidden states and each row's updated cache.
/// Per-token inputs shared by every layer: RoPE tables and the two adapter masks, and which
/// adapters the function applies.
struct TokenInputs<'a> {
    cos: &'a Value,
    sin: &'a Value,
    speech: &'a Value,
    vision: &'a Value,
    adapters: Adapters,
}

fn layers(
    f: &mut Func,
    w: &DecoderW,
    c: &TextConfig,
    mut x: Value,
    t: &TokenInputs,
    rows: &mut [RowArgs],
) -> Value {
    let (cos, sin) = (t.cos, t.sin);
    let total = x.dim(0);
    let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
    let (qw, kw) = (nh * hd, nkv * hd);
    let inter = c.intermediate_size;
    for (li, lw) in w.layers.iter().enumerate() {
        let normed = f.rms_norm(&x, &lw.input_norm, c.rms_norm_eps);
        let qkv = proj(f, &normed, &lw.qkv, t);
        let q = f.slice(&qkv, &[0, 0], &[total, qw]);
        let k = f.slice(&qkv, &[0, qw], &[total, qw + kw]);
        let v = f.slice(&qkv, &[0, qw + kw], &[total, qw + 2 * kw]);
        let q = f.reshape(&q, &[total, nh, hd]);
        let q = rope(f, &q, cos, sin, c);
        let q = f.reshape(&q, &[total, qw]);
        let k = f.reshape(&k, &[total, nkv, hd]);
        let k = rope(f, &k, cos, sin, c);
        let k = f.reshape(&k, &[total, kw]);
        let mut outs = Vec::with_capacity(rows.len());
        for r in rows.iter_mut() {
            let (t0, n) = r.x_rows;
            let qr = f.slice(&q, &[t0, 0], &[t0 + n, qw]);
            let kr = f.slice(&k, &[t0, 0], &[t0 + n, kw]);
            let vr = f.slice(&v, &[t0, 0], &[t0 + n, kw]);
            outs.push(cached_attention(f, li, &qr, &kr, &vr, r, c));
        }
        let refs: Vec<&Value> = outs.iter().collect();
        let attn = if refs.len() == 1 {
            outs[0].clone()
        } else {
            f.concat(&refs, 0)
        };
        let o = proj(f, &attn, &lw.o, t);
        x = f.add(&x, &o);

        let normed = f.rms_norm(&x, &lw.post_norm, c.rms_norm_eps);
        let gu = proj(f, &normed, &lw.gate_up, t);
        let gate = f.slice(&gu, &[0, 0], &[total, inter]);
        let up = f.slice(&gu, &[0, inter], &[total, 2 * inter]);
        let act = f.silu(&gate);
        let act = f.binary(BinaryOp::Mul, &up, &act);
        let d = proj(f, &act, &lw.down, t);
        x = f.add(&x, &d);
    }
    x
}

fn head(f: &mut Func, w: &DecoderW, c: &TextConfig, last: &Value) -> Value {
    let normed = f.rms_norm(last, &w.norm, c.rms_norm_eps);
    w.lm_head.product(f, &normed)
}

/// `prefill_s{S}_{A}(weights…, embeds [chunk, hidden], n [1] i32, pos0 [1] i32, cos, sin
/// [chunk, rot/2], adapter_masks [chunk, 2], k, v [layers, kv_heads, S, head_dim]) →
/// (logits [1, vocab] of token n−1, k, v)`; with `logits` false, `prefill_cache_s{S}_{A}` with
/// the same arguments returns only `(k, v)`. A row's chunks before its last need no logits, and
/// the head (a vocabulary-sized product) would cost about as much as the chunk's layers; IREE
/// drops everything that only fed it, down to the last layer's MLP.
fn emit_prefill(ck: &Checkpoint, s: &DecoderShape, fun: DecoderFn, w: &mut Weights) -> Func {
    let Kind::Prefill { logits } = fun.kind else {
        unreachable!("a prefill function")
    };
    let (c, size) = (&ck.config.text, fun.size);
    let chunk = s.chunk;
    let mut f = Func::new(&fun.name()).with_products(s.products);
    let dw = declare(&mut f, w, ck);
    let (h, half) = (c.hidden_size, c.rotary_dim / 2);
    let n = chunk;
    let x = f.arg(TensorType::f32(&[n, h]));
    let valid = f.arg(TensorType::i32(&[1]));
    let pos = f.arg(TensorType::i32(&[1]));
    let cos = f.arg(TensorType::f32(&[n, half]));
    let sin = f.arg(TensorType::f32(&[n, half]));
    let masks = f.arg(TensorType::f32(&[n, 2]));
    // The caches are results 0 and 1 without logits, 1 and 2 with them.
    let first = usize::from(logits);
    let cache = cache_type(c, size);
    let k = f.output_arg(cache.clone(), first);
    let v = f.output_arg(cache, first + 1);
    let sm = f.slice(&masks, &[0, 0], &[n, 1]);
    let sm = f.reshape(&sm, &[n]);
    let vm = f.slice(&masks, &[0, 1], &[n, 2]);
    let vm = f.reshape(&vm, &[n]);
    let pos0 = f.scalar_at(&pos, 0);
    let mut rows = [RowArgs {
        x_rows: (0, n),
        pos0,
        k,
        v,
    }];
    let t = TokenInputs {
        cos: &cos,
        sin: &sin,
        speech: &sm,
        vision: &vm,
        adapters: fun.adapters,
    };
    let x = layers(&mut f, &dw, c, x, &t, &mut rows);
    if !logits {
        let [row] = rows;
        f.ret(vec![row.k, row.v]);
        return f;
    }
    // Only token n−1 feeds the head.
    let one = f.splat_i32(1, &[]);
    let nv = f.scalar_at(&valid, 0);
    let last_i = f.sub(&nv, &one);
    let zero = f.splat_i32(0, &[]);
    let last = f.dynamic_slice(&x, &[&last_i, &zero], &[1, h]);
    let logits = head(&mut f, &dw, c, &last);
    let [row] = rows;
    f.ret(vec![logits, row.k, row.v]);
    f
}

/// `decode_b{B}_s{S}_{A}(weights…, embeds [B, hidden], pos [B] i32, cos, sin [B, rot/2],
/// adapter_masks [B, 2], k_0, v_0, …, k_{B−1}, v_{B−1}) → (logits [B, vocab], k_0, v_0, …)`.
fn emit_decode(ck: &Checkpoint, products: Products, fun: DecoderFn, w: &mut Weights) -> Func {
    let Kind::Decode { b } = fun.kind else {
        unreachable!("a decode function")
    };
    let (c, size) = (&ck.config.text, fun.size);
    let mut f = Func::new(&fun.name()).with_products(products);
    let dw = declare(&mut f, w, ck);
    let (h, half) = (c.hidden_size, c.rotary_dim / 2);
    let x = f.arg(TensorType::f32(&[b, h]));
    let pos = f.arg(TensorType::i32(&[b]));
    let cos = f.arg(TensorType::f32(&[b, half]));
    let sin = f.arg(TensorType::f32(&[b, half]));
    let masks = f.arg(TensorType::f32(&[b, 2]));
    let cache = cache_type(c, size);
    let mut rows: Vec<RowArgs> = Vec::with_capacity(b);
    for r in 0..b {
        // Results: logits, then k_0, v_0, k_1, ...
        let k = f.output_arg(cache.clone(), 1 + 2 * r);
        let v = f.output_arg(cache.clone(), 2 + 2 * r);
        let pos0 = f.scalar_at(&pos, r);
        rows.push(RowArgs {
            x_rows: (r, 1),
            pos0,
            k,
            v,
        });
    }
    let sm = f.slice(&masks, &[0, 0], &[b, 1]);
    let sm = f.reshape(&sm, &[b]);
    let vm = f.slice(&masks, &[0, 1], &[b, 2]);
    let vm = f.reshape(&vm, &[b]);
    let t = TokenInputs {
        cos: &cos,
        sin: &sin,
        speech: &sm,
        vision: &vm,
        adapters: fun.adapters,
    };
    let x = layers(&mut f, &dw, c, x, &t, &mut rows);
    let logits = head(&mut f, &dw, c, &x);
    let mut results = vec![logits];
    for r in rows {
        results.push(r.k);
        results.push(r.v);
    }
    f.ret(results);
    f
}

/// A row's K or V cache: `[layers, kv_heads, capacity, head_dim]`.
pub fn cache_type(c: &TextConfig, capacity: usize) -> TensorType {
    TensorType::f32(&[c.num_layers, c.num_kv_heads, capacity, c.head_dim])
}

/// The whole decoder module.
pub fn emit(ck: &Checkpoint, s: &DecoderShape) -> DecoderModule {
    let mut w = Weights::default();
    let funcs = s
        .functions()
        .into_iter()
        .map(|fun| match fun.kind {
            Kind::Prefill { .. } => emit_prefill(ck, s, fun, &mut w),
            Kind::Decode { .. } => emit_decode(ck, s.products, fun, &mut w),
        })
        .collect::<Vec<_>>();
    DecoderModule {
        mlir: mlir::module("decoder", &funcs),
        weights: w,
    }
}

#[cfg(test)]
mod tests {
    use super::{Adapters, DecoderShape, Kind};
    use crate::adapter::AdapterMode;

    #[test]
    fn a_call_runs_its_rows_adapters_and_each_such_set_is_compiled() {
        use AdapterMode::{None as Text, Speech, Vision};
        let shape = DecoderShape::new(112, 16, &[1, 2]);
        let functions = shape.functions();
        for (modes, want) in [
            (&[Text][..], Adapters::Base),
            (&[Speech], Adapters::Speech),
            (&[Vision], Adapters::Vision),
            (&[Text, Text], Adapters::Base),
            (&[Text, Vision], Adapters::Mixed),
            (&[Speech, Speech], Adapters::Mixed),
            (&[Speech, Text, Vision], Adapters::Mixed),
        ] {
            let adapters = Adapters::for_call(modes);
            assert_eq!(adapters, want, "{modes:?}");
            let b = modes.len().min(2);
            assert!(
                functions
                    .iter()
                    .any(|f| f.kind == Kind::Decode { b } && f.adapters == adapters),
                "{modes:?}"
            );
        }
        let names: Vec<String> = functions.iter().map(|f| f.name()).collect();
        assert!(names.contains(&"prefill_s128_speech".to_string()));
        assert!(names.contains(&"prefill_cache_s128_base".to_string()));
        assert!(names.contains(&"decode_b1_s128_vision".to_string()));
        assert!(names.contains(&"decode_b2_s128_mixed".to_string()));
        // Prefill 2 × 3 sets, batch 1 3 sets, batch 2 2 sets.
        assert_eq!(names.len(), 2 * 3 + 3 + 2);
    }

    #[test]
    fn cache_sizes_grow_geometrically_up_to_context_plus_chunk() {
        let s = DecoderShape::new(131_072, 64, &[1]);
        assert_eq!(s.buckets, [576, 2112, 8256, 32832, 131_136]);
        assert_eq!(s.context(), 131_072);
        assert_eq!(s.bucket(1), Some(576));
        assert_eq!(s.bucket(577), Some(2112));
        // A row of 32768 positions prefilled by whole chunks fits the size named for it.
        assert_eq!(s.bucket(32768 - 1 + 64), Some(32832));
        assert_eq!(s.bucket(131_136), Some(131_136));
        assert_eq!(s.bucket(131_137), None);
        // A context below the first size gets one size, exactly what it needs.
        assert_eq!(DecoderShape::new(112, 16, &[1]).buckets, [128]);
        // No size holds fewer rows than a chunk, and none more than half the context.
        assert_eq!(DecoderShape::new(4096, 1024, &[1]).buckets, [2048, 5120]);
    }
}
