//! The audio encoder on IREE: the compiled `audio` module (see `emit::audio` for its design) on
//! its own runtime thread. The host side only cuts the clip into subsampler chunks and attention
//! windows and stitches the rows back together; every number is computed by the module.

use eerie::runtime::{BufferView, Function, Program, Runtime, Value};

use crate::adapter::AudioBranch;
use crate::checkpoint::{AudioConfig, Checkpoint};
use crate::model::AudioEncoding;

use super::context::{IreeContext, Rows};
use super::emit::audio::{emit, sub_chunk, window_buckets, SUB_ROWS};
use super::error::{IreeError, IreeResult, Result};
use super::weights::Weights;
use super::worker::Worker;

struct AudioRt {
    runtime: Runtime,
    _program: Program,
    /// `subsample_r{R}` by its chunk size `R`.
    subsample: Vec<(usize, Function)>,
    windows: Vec<(usize, Function)>,
    weights: Vec<Value>,
}

pub struct IreeAudio {
    config: AudioConfig,
    text_hidden: usize,
    buckets: Vec<usize>,
    worker: Worker<AudioRt>,
}

fn f32_view(rt: &Runtime, shape: &[usize], data: &[f32]) -> Result<BufferView<f32>> {
    rt.buffer_view(shape, data).iree("IREE input buffer")
}

fn i32_view(rt: &Runtime, shape: &[usize], data: &[i32]) -> Result<BufferView<i32>> {
    rt.buffer_view(shape, data).iree("IREE input buffer")
}

/// Reads result `i` of a call as f32.
fn read(out: &mut std::vec::IntoIter<Value>, what: &str) -> Result<Vec<f32>> {
    let v: BufferView<f32> = out
        .next()
        .ok_or_else(|| IreeError::Runtime {
            what: what.to_string(),
            message: "missing result".into(),
        })?
        .try_into()
        .iree(what)?;
    v.read().iree(what)
}

impl IreeAudio {
    /// Emits the audio module and compiles it (or loads it from the cache): its bytes and the
    /// weights it takes, without a device ([`IreeAudio::load`] runs them).
    pub fn module(ck: &Checkpoint, ctx: &IreeContext) -> Result<(Vec<u8>, Weights)> {
        let c = &ck.config.audio;
        let module = emit(ck, ctx.encoder_products());
        let buckets = window_buckets(c.max_seq_len_window);
        let identity = format!(
            "audio v2 input={} hidden={} heads={} inter={} blocks={} channels={} reduction={} kernel={} bias_dist={} window={} text_hidden={} sub_rows={SUB_ROWS:?} buckets={buckets:?} f32",
            c.input_size,
            c.hidden_size,
            c.num_heads,
            c.intermediate_size,
            c.num_blocks,
            c.nemo_conv_channels,
            c.time_reduction,
            c.kernel_size,
            c.bias_max_distance,
            c.max_seq_len_window,
            ck.config.text.hidden_size,
        );
        let bytes = ctx.module_bytes(
            Rows::Many,
            "audio",
            &identity,
            &module.mlir,
            &module.weights,
        )?;
        Ok((bytes, module.weights))
    }

    /// Emits, compiles (or loads from the cache) and loads the audio module, uploads its weights.
    pub fn load(ck: &Checkpoint, ctx: &IreeContext) -> Result<Self> {
        let c = ck.config.audio.clone();
        let buckets = window_buckets(c.max_seq_len_window);
        let (bytes, weights) = Self::module(ck, ctx)?;
        let device = ctx.device.clone();
        let names = buckets.clone();
        let worker = Worker::spawn("phi4mm-iree-audio", move || -> Result<AudioRt> {
            let runtime = IreeContext::runtime(&device)?;
            let program = runtime.load_vmfb(&bytes).iree("loading the audio module")?;
            let func = |name: &str| {
                program
                    .function(&format!("audio.{name}"))
                    .iree(&format!("audio.{name}"))
            };
            let subsample = SUB_ROWS
                .iter()
                .map(|&r| Ok((r, func(&format!("subsample_r{r}"))?)))
                .collect::<Result<Vec<_>>>()?;
            let windows = names
                .iter()
                .map(|&w| Ok((w, func(&format!("window_w{w}"))?)))
                .collect::<Result<Vec<_>>>()?;
            let weights = weights.upload(&runtime).iree("uploading audio weights")?;
            Ok(AudioRt {
                runtime,
                _program: program,
                subsample,
                windows,
                weights,
            })
        })?;
        Ok(IreeAudio {
            config: c,
            text_hidden: ck.config.text.hidden_size,
            buckets,
            worker,
        })
    }

    /// Encoder rows of a clip of `frames` feature frames (as the host encoder).
    pub fn token_count(&self, frames: usize) -> usize {
        self.config.token_count(frames)
    }

    /// Encodes one clip of log-mel features `[frames, input_size]` and projects it with `branch`;
    /// the same result as the host `AudioEncoder::encode`.
    pub fn encode(
        &self,
        features: &[f32],
        frames: usize,
        branch: AudioBranch,
    ) -> Result<AudioEncoding> {
        let c = &self.config;
        let fin = c.input_size;
        if frames == 0 || features.len() != frames * fin {
            return Err(IreeError::AudioShape {
                values: features.len(),
                frames,
                width: fin,
            });
        }
        let d = c.hidden_size;
        let t = self.token_count(frames);
        let rows = self.subsample(features, frames, t)?;

        // Windows exactly as the host: one window of the clip's t rows (in the smallest bucket
        // that holds it, keys past t masked), or zero-padded windows of `win` rows, all valid.
        let win = c.max_seq_len_window;
        let (windows, wlen, valid) = if t > win {
            (t.div_ceil(win), win, win)
        } else {
            let b = *self
                .buckets
                .iter()
                .find(|&&b| b >= t)
                .expect("the last bucket is the full window");
            (1, b, t)
        };
        let mode = match branch {
            AudioBranch::Speech => 0,
            AudioBranch::Vision => 1,
        };
        let th = self.text_hidden;
        let mut encoder_out = Vec::with_capacity(windows * wlen * d);
        let mut embeds = Vec::with_capacity(windows * wlen * th);
        for w in 0..windows {
            let mut x = vec![0.0; wlen * d];
            let r0 = w * win;
            let n = t.saturating_sub(r0).min(wlen);
            x[..n * d].copy_from_slice(&rows[r0 * d..(r0 + n) * d]);
            let (enc, proj) = self.worker.run(move |rt| -> Result<(Vec<f32>, Vec<f32>)> {
                let r = &rt.runtime;
                let mut args: Vec<Value> = rt.weights.clone();
                args.push(f32_view(r, &[wlen, d], &x)?.into());
                args.push(i32_view(r, &[1], &[valid as i32])?.into());
                args.push(i32_view(r, &[1], &[mode])?.into());
                let func = &rt
                    .windows
                    .iter()
                    .find(|(b, _)| *b == wlen)
                    .expect("compiled bucket")
                    .1;
                let mut out = func
                    .invoke(args)
                    .iree(&format!("audio.window_w{wlen}"))?
                    .into_iter();
                Ok((
                    read(&mut out, "audio encoder output")?,
                    read(&mut out, "audio projection")?,
                ))
            })?;
            encoder_out.extend_from_slice(&enc);
            embeds.extend_from_slice(&proj);
        }
        // Drop the bucket's or the last window's padding rows.
        encoder_out.truncate(t * d);
        embeds.truncate(t * th);
        Ok(AudioEncoding {
            encoder_out,
            embeds,
            tokens: t,
        })
    }

    /// The subsampler's `[t, hidden]` rows, in chunks of [`sub_chunk`] rows: a chunk of `R`
    /// rows starting at row `r0` covers frames `[8·(r0 − 1), 8·(r0 + R + 1))` (one halo row each
    /// side, zeros outside the clip) and keeps its rows `1..=R`.
    fn subsample(&self, features: &[f32], frames: usize, t: usize) -> Result<Vec<f32>> {
        let c = &self.config;
        let (fin, d) = (c.input_size, c.hidden_size);
        let red = c.time_reduction;
        let stages = c.subsampling_stages();
        let mut rows = Vec::with_capacity(t * d);
        let mut r0 = 0;
        while r0 < t {
            let chunk = sub_chunk(t - r0);
            let n = (chunk + 2) * red;
            // Chunk start in frames (−red for the first chunk: its halo lies before the clip).
            let a = (r0 * red) as isize - red as isize;
            let mut x = vec![0.0; n * fin];
            for i in 0..n {
                let src = a + i as isize;
                if src >= 0 && (src as usize) < frames {
                    let s = src as usize * fin;
                    x[i * fin..(i + 1) * fin].copy_from_slice(&features[s..s + fin]);
                }
            }
            // Valid range of each stage, chunk-relative: the clip starts at −a and ends at
            // frames − a; stage k halves both (a is a multiple of 2^stages, the end rounds up).
            let mut bounds = Vec::with_capacity(2 * (stages + 1));
            let mut lo = (-a).max(0) as usize;
            let mut hi = (frames as isize - a) as usize;
            for _ in 0..=stages {
                bounds.push(lo as i32);
                bounds.push(hi as i32);
                lo /= 2;
                hi = hi.div_ceil(2);
            }
            let out = self.worker.run(move |rt| -> Result<Vec<f32>> {
                let r = &rt.runtime;
                let mut args: Vec<Value> = rt.weights.clone();
                args.push(f32_view(r, &[n, fin], &x)?.into());
                args.push(i32_view(r, &[bounds.len()], &bounds)?.into());
                let (_, function) = rt
                    .subsample
                    .iter()
                    .find(|(r, _)| *r == chunk)
                    .expect("a function per chunk size");
                let mut out = function.invoke(args).iree("audio.subsample")?.into_iter();
                read(&mut out, "audio subsampler output")
            })?;
            let keep = chunk.min(t - r0);
            rows.extend_from_slice(&out[d..(1 + keep) * d]);
            r0 += chunk;
        }
        Ok(rows)
    }
}
