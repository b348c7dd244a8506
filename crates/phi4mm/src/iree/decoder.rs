//! The decoder on IREE: the compiled `decoder` module on its own runtime thread, driven by the
//! same scheduler as the host backend through [`StepBackend`].
//!
//! Each row's KV cache lives on the device, in the worker's table under the row's id; a step
//! passes it in and keeps the returned buffers. Rows with one new token share a `decode_b{B}` call
//! (B the smallest compiled batch that fits, padded with a scratch row); rows with more tokens
//! (prefill chunks, re-encodes) run `prefill` chunk by chunk.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use eerie::runtime::{BufferView, Function, Program, Runtime, Value};

use crate::adapter::AdapterMode;
use crate::checkpoint::{Checkpoint, TensorView, TextConfig};
use crate::model::decoder::embed_tokens;
use crate::model::rope::{Rope, RopeState};
use crate::step::{StepBackend, StepRow};

use super::context::{IreeContext, Rows};
use super::emit::decoder::{cache_type, emit, DecoderShape};
use super::error::{IreeResult, Result};
use super::worker::Worker;

/// Decode batch sizes compiled into the module.
pub const DECODE_BATCHES: &[usize] = &[1, 2, 4, 8];

struct DecoderRt {
    _runtime: Runtime,
    _program: Program,
    prefill: Function,
    decode: Vec<(usize, Function)>,
    weights: Vec<Value>,
    /// Per-row caches (K, V), keyed by sequence id.
    caches: HashMap<u64, (BufferView<f32>, BufferView<f32>)>,
    /// Caches of the padding rows of decode calls, one pair per padding position.
    padding: Vec<(BufferView<f32>, BufferView<f32>)>,
    cache_shape: Vec<usize>,
}

impl DecoderRt {
    /// A fresh cache pair. Every buffer passed as a cache belongs to exactly one row (or padding
    /// position): IREE may update a cache argument in place, so two rows must never share one.
    fn new_cache(&self) -> Result<(BufferView<f32>, BufferView<f32>)> {
        let zeros = vec![0.0; self.cache_shape.iter().product()];
        Ok((
            f32_view(&self._runtime, &self.cache_shape, &zeros)?,
            f32_view(&self._runtime, &self.cache_shape, &zeros)?,
        ))
    }

    /// Takes row `id`'s cache out of the table (a new row gets a fresh one); the caller puts
    /// the call's returned buffers back.
    fn take_cache(&mut self, id: u64) -> Result<(BufferView<f32>, BufferView<f32>)> {
        match self.caches.remove(&id) {
            Some(c) => Ok(c),
            None => self.new_cache(),
        }
    }

    fn take_padding(&mut self, i: usize) -> Result<(BufferView<f32>, BufferView<f32>)> {
        while self.padding.len() <= i {
            let c = self.new_cache()?;
            self.padding.push(c);
        }
        // Leave a placeholder clone; it is replaced by the call's output.
        Ok(self.padding[i].clone())
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
    worker: Arc<Worker<DecoderRt>>,
}

impl IreeSequence {
    pub fn len(&self) -> usize {
        self.rope.len
    }

    pub fn is_empty(&self) -> bool {
        self.rope.len == 0
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

impl IreeDecoder {
    /// Emits, compiles (or loads from the cache) and loads the decoder, uploads its weights.
    pub fn load(ck: &Checkpoint, ctx: &IreeContext, capacity: usize, chunk: usize) -> Result<Self> {
        let c = ck.config.text.clone();
        let shape = DecoderShape {
            capacity,
            chunk,
            batches: DECODE_BATCHES,
        };
        let module = emit(ck, shape);
        let identity = format!(
            "decoder v2 layers={} hidden={} heads={}/{} head_dim={} rot={} inter={} vocab={} capacity={capacity} chunk={chunk} batches={:?} f32",
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.rotary_dim,
            c.intermediate_size,
            c.vocab_size,
            DECODE_BATCHES
        );
        let bytes = ctx.module_bytes(
            Rows::Few,
            "decoder",
            &identity,
            &module.mlir,
            &module.weights,
        )?;
        let weights = module.weights.clone();
        let device = ctx.device.clone();
        let cache_shape = cache_type(&c, capacity).shape;
        let worker = Worker::spawn("phi4mm-iree-decoder", move || -> Result<DecoderRt> {
            let runtime = IreeContext::runtime(&device)?;
            let program = runtime
                .load_vmfb(&bytes)
                .iree("loading the decoder module")?;
            let func = |name: &str| {
                program
                    .function(&format!("decoder.{name}"))
                    .iree(&format!("decoder.{name}"))
            };
            let prefill = func("prefill")?;
            let decode = DECODE_BATCHES
                .iter()
                .map(|&b| Ok((b, func(&format!("decode_b{b}"))?)))
                .collect::<Result<Vec<_>>>()?;
            let weights = weights.upload(&runtime).iree("uploading decoder weights")?;
            Ok(DecoderRt {
                _runtime: runtime,
                _program: program,
                prefill,
                decode,
                weights,
                caches: HashMap::new(),
                padding: Vec::new(),
                cache_shape,
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
        self.shape.capacity - self.shape.chunk
    }

    /// Runs `input` (`[n, hidden]`, n ≥ 1) of one row through `prefill`, chunk by chunk; returns
    /// the logits of its last token.
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
            let half = self.config.rotary_dim / 2;
            logits = self
                .worker
                .run(move |rt| -> Result<Vec<f32>> {
                    let (k, v) = rt.take_cache(id)?;
                    let r = &rt._runtime;
                    let mut args: Vec<Value> = rt.weights.clone();
                    args.push(f32_view(r, &[chunk, h], &x)?.into());
                    args.push(i32_view(r, &[1], &[m as i32])?.into());
                    args.push(i32_view(r, &[1], &[pos0 as i32])?.into());
                    args.push(f32_view(r, &[chunk, half], &cos)?.into());
                    args.push(f32_view(r, &[chunk, half], &sin)?.into());
                    args.push(f32_view(r, &[chunk, 2], &masks)?.into());
                    args.push(k.into());
                    args.push(v.into());
                    let mut out = rt.prefill.invoke(args).iree("decoder.prefill")?.into_iter();
                    let logits: BufferView<f32> =
                        out.next().unwrap().try_into().iree("decoder result")?;
                    let k: BufferView<f32> =
                        out.next().unwrap().try_into().iree("decoder result")?;
                    let v: BufferView<f32> =
                        out.next().unwrap().try_into().iree("decoder result")?;
                    rt.caches.insert(id, (k, v));
                    logits.read().iree("reading logits")
                })
                .unwrap_or_else(|e| panic!("IREE prefill failed: {e:#}"));
            st.rope.len += m;
            t0 += m;
        }
        logits
    }

    /// One token for each of `rows` (at most the largest compiled batch).
    fn decode(&self, rows: Vec<(&mut IreeSequence, Vec<f32>, AdapterMode)>) -> Vec<Vec<f32>> {
        let h = self.config.hidden_size;
        let half = self.config.rotary_dim / 2;
        let n = rows.len();
        let b = *DECODE_BATCHES
            .iter()
            .find(|&&b| b >= n)
            .expect("decode group no larger than the largest batch");
        let mut x = vec![0.0; b * h];
        let mut pos = vec![0i32; b];
        let mut cos = vec![0.0; b * half];
        let mut sin = vec![0.0; b * half];
        let mut modes = vec![AdapterMode::None; b];
        let mut ids = Vec::with_capacity(n);
        for (i, (st, e, a)) in rows.iter().enumerate() {
            assert!(
                st.rope.len < self.context(),
                "row exceeds the IREE decoder's context (checked at admission)"
            );
            x[i * h..(i + 1) * h].copy_from_slice(e);
            pos[i] = st.rope.len as i32;
            let (c, s) = self.rope.cos_sin(st.rope.len, 1, st.rope.mode);
            cos[i * half..(i + 1) * half].copy_from_slice(&c);
            sin[i * half..(i + 1) * half].copy_from_slice(&s);
            modes[i] = *a;
            ids.push(st.id);
        }
        let masks = adapter_masks(modes.into_iter());
        let logits = self
            .worker
            .run(move |rt| -> Result<Vec<f32>> {
                let mut caches = Vec::with_capacity(b);
                for i in 0..b {
                    caches.push(match ids.get(i) {
                        Some(&id) => rt.take_cache(id)?,
                        None => rt.take_padding(i - ids.len())?,
                    });
                }
                let r = &rt._runtime;
                let mut args: Vec<Value> = rt.weights.clone();
                args.push(f32_view(r, &[b, h], &x)?.into());
                args.push(i32_view(r, &[b], &pos)?.into());
                args.push(f32_view(r, &[b, half], &cos)?.into());
                args.push(f32_view(r, &[b, half], &sin)?.into());
                args.push(f32_view(r, &[b, 2], &masks)?.into());
                for (k, v) in caches {
                    args.push(k.into());
                    args.push(v.into());
                }
                let func = &rt.decode.iter().find(|(bb, _)| *bb == b).unwrap().1;
                let mut out = func
                    .invoke(args)
                    .iree(&format!("decoder.decode_b{b}"))?
                    .into_iter();
                let logits: BufferView<f32> =
                    out.next().unwrap().try_into().iree("decoder result")?;
                for i in 0..b {
                    let k: BufferView<f32> =
                        out.next().unwrap().try_into().iree("decoder result")?;
                    let v: BufferView<f32> =
                        out.next().unwrap().try_into().iree("decoder result")?;
                    match ids.get(i) {
                        Some(&id) => {
                            rt.caches.insert(id, (k, v));
                        }
                        None => rt.padding[i - ids.len()] = (k, v),
                    }
                }
                logits.read().iree("reading logits")
            })
            .unwrap_or_else(|e| panic!("IREE decode failed: {e:#}"));
        let vocab = self.config.vocab_size;
        let mut out = Vec::with_capacity(n);
        for (i, (st, _, _)) in rows.into_iter().enumerate() {
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
            worker: self.worker.clone(),
        }
    }

    fn embed(&self, ids: &[u32]) -> Vec<f32> {
        embed_tokens(&self.embed, &self.config, ids)
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
        let max_b = *DECODE_BATCHES.last().unwrap();
        let mut states: Vec<Option<&mut StepRow<'_, IreeSequence>>> =
            rows.iter_mut().map(Some).collect();
        for group in singles.chunks(max_b) {
            let batch: Vec<(&mut IreeSequence, Vec<f32>, AdapterMode)> = group
                .iter()
                .map(|(i, e)| {
                    let r = states[*i].take().expect("row in one group");
                    let adapter = r.adapter;
                    (&mut *r.state, e.clone(), adapter)
                })
                .collect();
            for ((i, _), l) in group.iter().zip(self.decode(batch)) {
                out[*i] = l;
            }
        }
        out
    }
}
