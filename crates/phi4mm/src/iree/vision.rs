//! The vision tower on IREE: the compiled `vision` module on its own runtime thread. Returns the
//! same [`ImageEncoding`] as the host [`crate::model::VisionEncoder`]: the tower, pooling and
//! projection run on IREE; the host only computes indices (position ids, the HD row layout) and
//! copies rows into place.

use eerie::runtime::{BufferView, Function, Program, Runtime, Value};

use crate::checkpoint::{Checkpoint, VisionConfig};
use crate::model::vision::{position_ids, HdLayout};
use crate::model::{ImageEncoding, ImageInput};

use super::context::{IreeContext, Rows};
use super::emit::vision::{emit, PROJECT_ROWS};
use super::error::{IreeResult, Result};
use super::weights::Weights;
use super::worker::Worker;

struct VisionRt {
    runtime: Runtime,
    _program: Program,
    main: Function,
    project: Function,
    weights: Vec<Value>,
}

pub struct IreeVision {
    config: VisionConfig,
    text_hidden: usize,
    hd: HdLayout,
    worker: Worker<VisionRt>,
}

fn f32_view(rt: &Runtime, shape: &[usize], data: &[f32]) -> Result<BufferView<f32>> {
    rt.buffer_view(shape, data).iree("IREE input buffer")
}

impl IreeVision {
    /// Emits the vision module and compiles it (or loads it from the cache): its bytes and the
    /// weights it takes, without a device ([`IreeVision::load`] runs them).
    pub fn module(ck: &Checkpoint, ctx: &IreeContext) -> Result<(Vec<u8>, Weights)> {
        let c = &ck.config.vision;
        let text_hidden = ck.config.text.hidden_size;
        let module = emit(ck, ctx.encoder_products());
        let identity = format!(
            "vision v2 layers_used={} hidden={} heads={} inter={} channels={} image={} patch={} eps={:e} text_hidden={text_hidden} project_rows={PROJECT_ROWS} f32",
            c.layers_used(),
            c.hidden_size,
            c.num_heads,
            c.intermediate_size,
            c.num_channels,
            c.image_size,
            c.patch_size,
            c.layer_norm_eps,
        );
        let bytes = ctx.module_bytes(
            Rows::Many,
            "vision",
            &identity,
            &module.mlir,
            &module.weights,
        )?;
        Ok((bytes, module.weights))
    }

    /// Emits, compiles (or loads from the cache) and loads the vision module, uploads its weights.
    pub fn load(ck: &Checkpoint, ctx: &IreeContext) -> Result<Self> {
        let c = ck.config.vision.clone();
        let text_hidden = ck.config.text.hidden_size;
        let (bytes, weights) = Self::module(ck, ctx)?;
        let device = ctx.device.clone();
        let worker = Worker::spawn("phi4mm-iree-vision", move || -> Result<VisionRt> {
            let runtime = IreeContext::runtime(&device)?;
            let program = runtime
                .load_vmfb(&bytes)
                .iree("loading the vision module")?;
            let func = |name: &str| {
                program
                    .function(&format!("vision.{name}"))
                    .iree(&format!("vision.{name}"))
            };
            let main = func("main")?;
            let project = func("project")?;
            let weights = weights.upload(&runtime).iree("uploading vision weights")?;
            Ok(VisionRt {
                runtime,
                _program: program,
                main,
                project,
                weights,
            })
        })?;
        Ok(IreeVision {
            hd: HdLayout::load(ck),
            config: c,
            text_hidden,
            worker,
        })
    }

    /// Number of decoder rows the image produces (the host encoder's rule).
    pub fn token_count(&self, image: &ImageInput) -> usize {
        self.hd.token_count(image)
    }

    /// Runs the tower on every crop and builds the projected image rows.
    pub fn encode(&self, image: &ImageInput) -> Result<ImageEncoding> {
        let c = &self.config;
        let (grid, hid) = (c.grid(), c.hidden_size);
        let np = grid * grid;
        self.hd.check(image)?;
        let crop_len = c.num_channels * c.image_size * c.image_size;

        // Tower + pooling, one crop per call.
        let mut features = Vec::with_capacity(image.crops * np * hid);
        let mut pooled: Vec<Vec<f32>> = Vec::with_capacity(image.crops);
        for k in 0..image.crops {
            let mask = &image.patch_masks[k * np..(k + 1) * np];
            let ids: Vec<i32> = position_ids(c, mask)
                .into_iter()
                .map(|i| i as i32)
                .collect();
            let valid: Vec<f32> = mask.iter().map(|&m| (m != 0) as u8 as f32).collect();
            let pixels = image.pixel_values[k * crop_len..(k + 1) * crop_len].to_vec();
            let shape = [1, c.num_channels, c.image_size, c.image_size];
            let (f, p) = self.worker.run(move |rt| -> Result<(Vec<f32>, Vec<f32>)> {
                let r = &rt.runtime;
                let mut args: Vec<Value> = rt.weights.clone();
                args.push(f32_view(r, &shape, &pixels)?.into());
                let ids: BufferView<i32> = r.buffer_view(&[np], &ids).iree("IREE input buffer")?;
                args.push(ids.into());
                args.push(f32_view(r, &[np], &valid)?.into());
                let mut out = rt.main.invoke(args).iree("vision.main")?.into_iter();
                let f: BufferView<f32> = out.next().unwrap().try_into().iree("vision result")?;
                let p: BufferView<f32> = out.next().unwrap().try_into().iree("vision result")?;
                Ok((
                    f.read().iree("reading features")?,
                    p.read().iree("reading pooled rows")?,
                ))
            })?;
            features.extend_from_slice(&f);
            pooled.push(p);
        }

        // HD layout: index shuffling only.
        let rows = self.hd.assemble(image, &pooled);
        let tokens = rows.len() / hid;

        // Projection in fixed buckets; the MLP is row-wise, so zero padding rows are discarded.
        let out_dim = self.text_hidden;
        let mut embeds = Vec::with_capacity(tokens * out_dim);
        for chunk in rows.chunks(PROJECT_ROWS * hid) {
            let n = chunk.len() / hid;
            let mut bucket = vec![0.0; PROJECT_ROWS * hid];
            bucket[..chunk.len()].copy_from_slice(chunk);
            let out = self.worker.run(move |rt| -> Result<Vec<f32>> {
                let mut args: Vec<Value> = rt.weights.clone();
                args.push(f32_view(&rt.runtime, &[PROJECT_ROWS, hid], &bucket)?.into());
                let mut out = rt.project.invoke(args).iree("vision.project")?.into_iter();
                let y: BufferView<f32> = out.next().unwrap().try_into().iree("vision result")?;
                y.read().iree("reading projected rows")
            })?;
            embeds.extend_from_slice(&out[..n * out_dim]);
        }
        Ok(ImageEncoding {
            features,
            embeds,
            tokens,
        })
    }
}
