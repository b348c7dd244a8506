//! The decoder on IREE: the compiled `decoder` module on its own runtime thread, driven by the
//! same scheduler as the host backend through [`StepBackend`].
//!
//! Each row's KV cache lives on the device, in the worker's table under the row's id, at one of
//! the module's cache sizes ([`DecoderShape`]); a step passes it in and IREE writes the step's
//! keys and values into it in place (the cache arguments are their results' storage). A row
//! starts at the smallest size that holds what the call needs and moves to a larger one only
//! when it outgrows it, so its memory and its step cost
//! follow its length, not the context. Rows with one new token share a `decode_b{B}_s{S}_{A}` call
//! per cache size; rows with more tokens (prefill chunks, re-encodes) run `prefill_s{S}_{A}`
//! chunk by chunk. `A` is the set of LoRA adapters the call's rows need
//! ([`Adapters::for_call`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use eerie::runtime::{BufferView, Function, Program, Runtime, Value};

use crate::adapter::AdapterMode;
use crate::checkpoint::{Checkpoint, TensorView, TextConfig};
use crate::model::decoder::embed_tokens;
use crate::model::rope::{Rope, RopeState};
use crate::step::{StepBackend, StepRow};

use super::compiler::CompileTarget;
use super::context::{IreeContext, Rows};
use super::emit::decoder::{cache_type, emit, Adapters, DecoderFn, DecoderShape, Kind};
use super::error::{IreeResult, Result};
use super::mlir::Products;
use super::tiles::TileShape;
use super::weights::Weights;
use super::worker::Worker;

/// Decode batch sizes compiled into the module, for every cache size.
pub const DECODE_BATCHES: &[usize] = &[1, 2, 4, 8];

/// One row's K and V caches on the device, `[layers, kv_heads, size, head_dim]` each.
struct RowCache {
    size: usize,
    k: BufferView<f32>,
    v: BufferView<f32>,
}

struct DecoderRt {
    runtime: Runtime,
    _program: Program,
    functions: HashMap<String, Function>,
    weights: Vec<Value>,
    /// Per-row caches, keyed by sequence id.
    caches: HashMap<u64, RowCache>,
    /// Caches of the padding rows of decode calls at the smallest size, one per position.
    padding: Vec<RowCache>,
    config: TextConfig,
}

impl DecoderRt {
    /// A zeroed cache of `size` positions. Every buffer passed as a cache belongs to exactly one
    /// row (or padding position): IREE updates a cache argument in place, so two rows must
    /// never share one.
    fn zeros(&self, size: usize) -> Result<RowCache> {
        let shape = cache_type(&self.config, size).shape;
        let zeros = vec![0.0; shape.iter().product()];
        Ok(RowCache {
            size,
            k: f32_view(&self.runtime, &shape, &zeros)?,
            v: f32_view(&self.runtime, &shape, &zeros)?,
        })
    }

    /// `c` moved into a cache of `size` positions: each head's positions are copied through
    /// the host once, when a row outgrows its size, which is at most once per size.
    fn grow(&self, c: RowCache, size: usize) -> Result<RowCache> {
        let shape = cache_type(&self.config, size).shape;
        let (heads, hd) = (shape[0] * shape[1], shape[3]);
        let widen = |old: &BufferView<f32>| -> Result<BufferView<f32>> {
            let old = old.read().iree("reading a KV cache")?;
            let mut new = vec![0.0; heads * size * hd];
            for (dst, src) in new
                .chunks_exact_mut(size * hd)
                .zip(old.chunks_exact(c.size * hd))
            {
                dst[..src.len()].copy_from_slice(src);
            }
            f32_view(&self.runtime, &shape, &new)
        };
        Ok(RowCache {
            size,
            k: widen(&c.k)?,
            v: widen(&c.v)?,
        })
    }

    /// Takes row `id`'s cache out of the table at `size` positions (a new row gets a fresh one,
    /// a smaller one grows); the caller puts the call's returned buffers back.
    fn take_cache(&mut self, id: u64, size: usize) -> Result<RowCache> {
        match self.caches.remove(&id) {
            Some(c) if c.size == size => Ok(c),
            Some(c) => self.grow(c, size),
            None => self.zeros(size),
        }
    }

    /// Padding position `i`'s cache (at the smallest size), created on first use.
    fn take_padding(&mut self, i: usize, size: usize) -> Result<RowCache> {
        while self.padding.len() <= i {
            let c = self.zeros(size)?;
            self.padding.push(c);
        }
        let c = &self.padding[i];
        // Leave a placeholder clone; it is replaced by the call's output.
        Ok(RowCache {
            size,
            k: c.k.clone(),
            v: c.v.clone(),
        })
    }

    /// Calls the module's function `name`; its results are all f32 buffers, in order.
    fn invoke(&self, name: &str, args: Vec<Value>) -> Result<Vec<BufferView<f32>>> {
        self.functions[name]
            .invoke(args)
            .iree(&format!("decoder.{name}"))?
            .into_iter()
            .map(|v| v.try_into().iree("decoder result"))
            .collect()
    }
}

pub struct IreeDecoder {
    config: TextConfig,
    rope: Rope,
    embed: TensorView,
    shape: DecoderShape,
    worker: Arc<Worker<DecoderRt>>,
    next_id: AtomicU64,
}

/// One row's decoder state: its position and RoPE state here, its KV cache on the device.
pub struct IreeSequence {
    id: u64,
    rope: RopeState,
    /// The size of the row's cache on the device (0 before its first call).
    size: usize,
    worker: Arc<Worker<DecoderRt>>,
}

impl IreeSequence {
    pub fn len(&self) -> usize {
        self.rope.len
    }

    pub fn is_empty(&self) -> bool {
        self.rope.len == 0
    }

    /// Positions of the row's cache on the device (0 before its first step).
    pub fn cache_size(&self) -> usize {
        self.size
    }
}

impl Drop for IreeSequence {
    fn drop(&mut self) {
        let id = self.id;
        self.worker.post(move |rt| {
            rt.caches.remove(&id);
        });
    }
}

fn f32_view(rt: &Runtime, shape: &[usize], data: &[f32]) -> Result<BufferView<f32>> {
    rt.buffer_view(shape, data).iree("IREE input buffer")
}

fn i32_view(rt: &Runtime, shape: &[usize], data: &[i32]) -> Result<BufferView<i32>> {
    rt.buffer_view(shape, data).iree("IREE input buffer")
}

fn adapter_masks(modes: impl Iterator<Item = AdapterMode>) -> Vec<f32> {
    modes
        .flat_map(|m| {
            [
                (m == AdapterMode::Speech) as u8 as f32,
                (m == AdapterMode::Vision) as u8 as f32,
            ]
        })
        .collect()
}

/// Rows per decode call for `n` rows at one cache size. At the smallest size the rows share one
/// call padded up to the next compiled batch (a padding row's cache is small there); above it a
/// padding row would need a cache of that size, so the rows split into exact compiled batches.
fn decode_calls(n: usize, pad: bool) -> Vec<usize> {
    if pad {
        return vec![n];
    }
    let mut calls = Vec::new();
    let mut left = n;
    while left > 0 {
        let b = *DECODE_BATCHES.iter().rev().find(|&&b| b <= left).unwrap();
        calls.push(b);
        left -= b;
    }
    calls
}

impl IreeDecoder {
    /// Emits the decoder for `shape` and compiles it (or loads it from the cache): its bytes and
    /// the weights it takes, without a device ([`IreeDecoder::load`] runs them).
    pub fn module(
        ck: &Checkpoint,
        ctx: &IreeContext,
        shape: &DecoderShape,
    ) -> Result<(Vec<u8>, Weights)> {
        let c = &ck.config.text;
        let chunk = shape.chunk;
        let module = emit(ck, shape);
        let identity = format!(
            "decoder v7 layers={} hidden={} heads={}/{} head_dim={} rot={} inter={} vocab={} sizes={:?} chunk={chunk} batches={:?} f32",
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.rotary_dim,
            c.intermediate_size,
            c.vocab_size,
            shape.buckets,
            DECODE_BATCHES
        );
        let bytes = ctx.module_bytes(
            Rows::Few,
            "decoder",
            &identity,
            &module.mlir,
            &module.weights,
        )?;
        Ok((bytes, module.weights))
    }

    /// The shape [`IreeDecoder::load`] compiles for rows of up to `context` positions, with the
    /// products its compile target runs best. On CUDA, IREE 3.13 runs a few-row f32 × bf16
    /// matrix product on a handful of workgroups that each walk the whole reduction (a 64 × 1024
    /// × 2816 product: 0.79 ms on an H200), while its matrix-vector products stream the weight
    /// at about 3.3 TB/s; so decode rows become one matrix-vector product each, and a prefill
    /// chunk's product puts the weight's rows on the long side. Measured on the H200 against
    /// the CPU's form: batch-8 decode 1.54×, prefill 1.55× (`docs/benchmarks.md`).
    pub fn shape(context: usize, chunk: usize, ctx: &IreeContext) -> DecoderShape {
        let products = match ctx.compiler.target() {
            CompileTarget::Cuda { .. } => Products::RowMatvecs,
            CompileTarget::LlvmCpu { cpu } => Products::Tiles(TileShape::for_cpu(cpu)),
        };
        DecoderShape::new(context, chunk, DECODE_BATCHES).with_products(products)
    }

    /// Emits, compiles (or loads from the cache) and loads the decoder for rows of up to
    /// `context` positions, uploads its weights.
    pub fn load(ck: &Checkpoint, ctx: &IreeContext, context: usize, chunk: usize) -> Result<Self> {
        Self::load_shape(ck, ctx, Self::shape(context, chunk, ctx))
    }

    /// [`IreeDecoder::load`] for a given shape (its product form chosen by the caller).
    pub fn load_shape(ck: &Checkpoint, ctx: &IreeContext, shape: DecoderShape) -> Result<Self> {
        let c = ck.config.text.clone();
        let (bytes, weights) = Self::module(ck, ctx, &shape)?;
        let device = ctx.device.clone();
        let names: Vec<String> = shape.functions().iter().map(DecoderFn::name).collect();
        let config = c.clone();
        let worker = Worker::spawn("phi4mm-iree-decoder", move || -> Result<DecoderRt> {
            let runtime = IreeContext::runtime(&device)?;
            let program = runtime
                .load_vmfb(&bytes)
                .iree("loading the decoder module")?;
            let functions = names
                .into_iter()
                .map(|name| {
                    let f = program
                        .function(&format!("decoder.{name}"))
                        .iree(&format!("decoder.{name}"))?;
                    Ok((name, f))
                })
                .collect::<Result<HashMap<_, _>>>()?;
            let weights = weights.upload(&runtime).iree("uploading decoder weights")?;
            Ok(DecoderRt {
                runtime,
                _program: program,
                functions,
                weights,
                caches: HashMap::new(),
                padding: Vec::new(),
                config,
            })
        })?;
        Ok(IreeDecoder {
            rope: Rope::new(&c),
            embed: ck.tensor("model.embed_tokens.weight").clone(),
            config: c,
            shape,
            worker: Arc::new(worker),
            next_id: AtomicU64::new(0),
        })
    }

    /// Longest prompt + generated tokens a row can hold.
    pub fn context(&self) -> usize {
        self.shape.context()
    }

    /// The compiled cache sizes, ascending.
    pub fn cache_sizes(&self) -> &[usize] {
        &self.shape.buckets
    }

    /// Device bytes of one row's K and V caches at `size` positions.
    pub fn cache_bytes(&self, size: usize) -> usize {
        let c = &self.config;
        2 * c.num_layers * c.num_kv_heads * size * c.head_dim * std::mem::size_of::<f32>()
    }

    /// The most device memory a row of `positions` positions (prompt + generated) can come to:
    /// its prefill calls write whole chunks, so it may reach the size that holds
    /// `positions − 1 + chunk`. `None` beyond the context.
    pub fn row_cache_bytes(&self, positions: usize) -> Option<usize> {
        if positions > self.context() {
            return None;
        }
        let need = positions.max(1) - 1 + self.shape.chunk;
        self.shape.bucket(need).map(|s| self.cache_bytes(s))
    }

    /// The cache size a call needing `positions` positions of row `st` runs at: rows never shrink.
    fn size_for(&self, st: &IreeSequence, positions: usize) -> usize {
        let need = self
            .shape
            .bucket(positions)
            .expect("row within the IREE decoder's context (checked at admission)");
        need.max(st.size)
    }

    /// Runs `input` (`[n, hidden]`, n ≥ 1) of one row through `prefill_cache_s{S}_{A}` chunk by
    /// chunk, its last chunk through `prefill_s{S}_{A}`; returns the logits of its last token.
    fn prefill(&self, st: &mut IreeSequence, input: Vec<f32>, adapter: AdapterMode) -> Vec<f32> {
        let h = self.config.hidden_size;
        let chunk = self.shape.chunk;
        let n = input.len() / h;
        assert!(
            st.rope.len + n <= self.context(),
            "row of {} positions exceeds the IREE decoder's context of {} (checked at admission)",
            st.rope.len + n,
            self.context()
        );
        let mut logits = Vec::new();
        let mut t0 = 0;
        while t0 < n {
            let m = chunk.min(n - t0);
            let mut x = vec![0.0; chunk * h];
            x[..m * h].copy_from_slice(&input[t0 * h..(t0 + m) * h]);
            let (cos, sin) = self.rope.cos_sin(st.rope.len, chunk, st.rope.mode);
            let masks = adapter_masks(std::iter::repeat_n(adapter, chunk));
            let (id, pos0) = (st.id, st.rope.len);
            // The call writes a whole chunk of keys from pos0.
            let size = self.size_for(st, pos0 + chunk);
            let half = self.config.rotary_dim / 2;
            // Only the last chunk's logits are returned.
            let last = t0 + m == n;
            logits = self
                .worker
                .run(move |rt| -> Result<Vec<f32>> {
                    let cache = rt.take_cache(id, size)?;
                    let r = &rt.runtime;
                    let mut args: Vec<Value> = rt.weights.clone();
                    args.push(f32_view(r, &[chunk, h], &x)?.into());
                    args.push(i32_view(r, &[1], &[m as i32])?.into());
                    args.push(i32_view(r, &[1], &[pos0 as i32])?.into());
                    args.push(f32_view(r, &[chunk, half], &cos)?.into());
                    args.push(f32_view(r, &[chunk, half], &sin)?.into());
                    args.push(f32_view(r, &[chunk, 2], &masks)?.into());
                    args.push(cache.k.into());
                    args.push(cache.v.into());
                    let name = DecoderFn {
                        kind: Kind::Prefill { logits: last },
                        size,
                        adapters: Adapters::for_call(&[adapter]),
                    }
                    .name();
                    let mut out = rt.invoke(&name, args)?.into_iter();
                    let logits = if last { out.next() } else { None };
                    let (k, v) = (out.next().unwrap(), out.next().unwrap());
                    rt.caches.insert(id, RowCache { size, k, v });
                    match logits {
                        Some(l) => l.read().iree("reading logits"),
                        None => Ok(Vec::new()),
                    }
                })
                .unwrap_or_else(|e| panic!("IREE prefill failed: {e:#}"));
            st.size = size;
            st.rope.len += m;
            t0 += m;
        }
        logits
    }

    /// One token for each of `rows`, whose caches all run at `size` positions, in one call of
    /// `b` ≥ rows.len() rows (padded at the smallest size).
    fn decode(
        &self,
        rows: Vec<(&mut IreeSequence, Vec<f32>, AdapterMode)>,
        size: usize,
        b: usize,
    ) -> Vec<Vec<f32>> {
        let h = self.config.hidden_size;
        let half = self.config.rotary_dim / 2;
        let n = rows.len();
        let mut x = vec![0.0; b * h];
        let mut pos = vec![0i32; b];
        let mut cos = vec![0.0; b * half];
        let mut sin = vec![0.0; b * half];
        let mut modes = vec![AdapterMode::None; b];
        let mut ids = Vec::with_capacity(n);
        for (i, (st, e, a)) in rows.iter().enumerate() {
            x[i * h..(i + 1) * h].copy_from_slice(e);
            pos[i] = st.rope.len as i32;
            let (c, s) = self.rope.cos_sin(st.rope.len, 1, st.rope.mode);
            cos[i * half..(i + 1) * half].copy_from_slice(&c);
            sin[i * half..(i + 1) * half].copy_from_slice(&s);
            modes[i] = *a;
            ids.push(st.id);
        }
        let adapters = Adapters::for_call(&modes);
        let masks = adapter_masks(modes.into_iter());
        let logits = self
            .worker
            .run(move |rt| -> Result<Vec<f32>> {
                let mut caches = Vec::with_capacity(b);
                for i in 0..b {
                    caches.push(match ids.get(i) {
                        Some(&id) => rt.take_cache(id, size)?,
                        None => rt.take_padding(i - ids.len(), size)?,
                    });
                }
                let r = &rt.runtime;
                let mut args: Vec<Value> = rt.weights.clone();
                args.push(f32_view(r, &[b, h], &x)?.into());
                args.push(i32_view(r, &[b], &pos)?.into());
                args.push(f32_view(r, &[b, half], &cos)?.into());
                args.push(f32_view(r, &[b, half], &sin)?.into());
                args.push(f32_view(r, &[b, 2], &masks)?.into());
                for c in caches {
                    args.push(c.k.into());
                    args.push(c.v.into());
                }
                let name = DecoderFn {
                    kind: Kind::Decode { b },
                    size,
                    adapters,
                }
                .name();
                let mut out = rt.invoke(&name, args)?.into_iter();
                let logits = out.next().unwrap();
                for i in 0..b {
                    let cache = RowCache {
                        size,
                        k: out.next().unwrap(),
                        v: out.next().unwrap(),
                    };
                    match ids.get(i) {
                        Some(&id) => {
                            rt.caches.insert(id, cache);
                        }
                        None => rt.padding[i - ids.len()] = cache,
                    }
                }
                logits.read().iree("reading logits")
            })
            .unwrap_or_else(|e| panic!("IREE decode failed: {e:#}"));
        let vocab = self.config.vocab_size;
        let mut out = Vec::with_capacity(n);
        for (i, (st, _, _)) in rows.into_iter().enumerate() {
            st.size = size;
            st.rope.len += 1;
            out.push(logits[i * vocab..(i + 1) * vocab].to_vec());
        }
        out
    }
}

impl StepBackend for IreeDecoder {
    type State = IreeSequence;

    fn new_state(&self) -> IreeSequence {
        IreeSequence {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            rope: RopeState::default(),
            size: 0,
            worker: self.worker.clone(),
        }
    }

    fn embed(&self, ids: &[u32]) -> Vec<f32> {
        embed_tokens(&self.embed, &self.config, ids)
    }

    fn kv_bytes(&self, positions: usize) -> usize {
        // Beyond the context nothing fits; admission refuses such rows before they get here.
        self.row_cache_bytes(positions).unwrap_or(usize::MAX)
    }

    /// Each prefill call runs `iree.prefill_chunk` positions, zero-padded.
    fn prefill_granularity(&self) -> usize {
        self.shape.chunk
    }

    fn step(&self, rows: &mut [StepRow<'_, IreeSequence>]) -> Vec<Vec<f32>> {
        let h = self.config.hidden_size;
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
        let mut singles = Vec::new();
        for (i, row) in rows.iter_mut().enumerate() {
            let n = row.tokens(h);
            let st = &mut *row.state;
            // A re-encode needs no cache reset here: the stale device cache is overwritten from
            // position 0, and keys past a row's position are masked.
            let input = st.rope.plan(&self.rope, row.embeds, n).embeds().to_vec();
            if input.len() == h {
                singles.push((i, input));
            } else {
                out[i] = self.prefill(st, input, row.adapter);
            }
        }
        // One token per row: rows at the same cache size share calls.
        let mut by_size: BTreeMap<usize, Vec<(usize, Vec<f32>)>> = BTreeMap::new();
        for (i, input) in singles {
            let size = self.size_for(&*rows[i].state, rows[i].state.rope.len + 1);
            by_size.entry(size).or_default().push((i, input));
        }
        let max_b = *DECODE_BATCHES.last().unwrap();
        let smallest = self.shape.buckets[0];
        let mut states: Vec<Option<&mut StepRow<'_, IreeSequence>>> =
            rows.iter_mut().map(Some).collect();
        for (size, group) in by_size {
            for group in group.chunks(max_b) {
                let mut rest = group;
                for n in decode_calls(group.len(), size == smallest) {
                    let (call, tail) = rest.split_at(n);
                    rest = tail;
                    let b = *DECODE_BATCHES.iter().find(|&&b| b >= n).unwrap();
                    let batch: Vec<(&mut IreeSequence, Vec<f32>, AdapterMode)> = call
                        .iter()
                        .map(|(i, e)| {
                            let r = states[*i].take().expect("row in one call");
                            let adapter = r.adapter;
                            (&mut *r.state, e.clone(), adapter)
                        })
                        .collect();
                    for ((i, _), l) in call.iter().zip(self.decode(batch, size, b)) {
                        out[*i] = l;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::decode_calls;

    #[test]
    fn rows_split_into_compiled_batches_unless_padded() {
        assert_eq!(decode_calls(3, true), [3]);
        assert_eq!(decode_calls(7, false), [4, 2, 1]);
        assert_eq!(decode_calls(8, false), [8]);
        assert_eq!(decode_calls(5, false), [4, 1]);
    }
}
