//! The IREE decoder against the fixture, both checkpoint layouts: every case that carries the
//! reference's own merged input embeddings (media cases), and every text case (token
//! embeddings), so the decoder is checked on its own: first-step logits within the fixture tolerance and the
//! 8 greedy tokens exact.

use crate::iree_support::CHUNK;
use crate::model_support::*;
use switchyard_phi4mm::sampling::argmax;
use switchyard_phi4mm::step::{StepBackend, StepRow};

fn run(layout: &str) {
    let dec = crate::iree_support::decoder(layout);
    let refs = model_cases();
    let cases = manifest()["model_cases"]["cases"].as_object().unwrap();
    let mut checked = 0;
    let mut sizes_seen = std::collections::BTreeSet::new();
    for (case, m) in cases {
        let t = |n: &str| format!("{case}.{n}");
        let has_media = !m["images"].as_array().unwrap().is_empty()
            || !m["audios"].as_array().unwrap().is_empty();
        if has_media && !refs.has(&t("inputs_embeds")) {
            // Chat cases with media carry no merged embeddings: the full-backend test covers them.
            continue;
        }
        checked += 1;
        let ids: Vec<u32> = refs
            .i64(&t("input_ids"))
            .0
            .iter()
            .map(|&i| i as u32)
            .collect();
        let embeds = if refs.has(&t("inputs_embeds")) {
            refs.f32(&t("inputs_embeds")).0
        } else {
            dec.embed(&ids)
        };
        let mode = case_adapter(case);
        let mut st = dec.new_state();
        let mut logits = dec
            .step(&mut [StepRow {
                state: &mut st,
                embeds: &embeds,
                adapter: mode,
            }])
            .remove(0);
        let (want, _) = refs.f32(&t("logits_first"));
        assert_matches_reference(
            &format!("{layout} {case} logits_first"),
            &logits,
            &want,
            1e-4,
            1e-4,
        );
        let want_tokens = reference_tokens(case);
        let mut tokens = Vec::new();
        while tokens.len() < want_tokens.len() {
            let next = argmax(&logits);
            tokens.push(next);
            let e = dec.embed(&[next]);
            logits = dec
                .step(&mut [StepRow {
                    state: &mut st,
                    embeds: &e,
                    adapter: mode,
                }])
                .remove(0);
        }
        assert_eq!(tokens, want_tokens, "{layout} {case} greedy tokens");
        assert_eq!(st.len(), ids.len() + tokens.len(), "{case} positions");
        // The row's device memory follows its length, not the context: it holds the smallest
        // compiled cache size that fits what its calls wrote (prefill writes whole chunks).
        let wrote = st.len().max(ids.len().div_ceil(CHUNK) * CHUNK);
        let smallest = dec.cache_sizes().iter().find(|&&s| s >= wrote).unwrap();
        assert_eq!(st.cache_size(), *smallest, "{case} cache size");
        sizes_seen.insert(st.cache_size());
    }
    // The decoder serves the checkpoint's whole context, and the fixture's rows, short and
    // past 4096 positions, took different sizes, none of them the largest.
    assert_eq!(dec.context(), 131_072);
    assert!(sizes_seen.len() >= 2, "sizes {sizes_seen:?}");
    assert!(!sizes_seen.contains(dec.cache_sizes().last().unwrap()));
    assert_eq!(checked, 11, "cases with embeddings or text only");
}

#[test]
fn every_case_native_layout() {
    run("model");
}

#[test]
fn every_case_original_layout() {
    run("model-original");
}

/// A decode step writes the row's new key and value into the very buffers the caller passed as
/// its cache (`iree.abi.output`), instead of returning a fresh copy of the whole cache: a clone
/// of the argument taken before the call (the same device buffer) sees the step's key, and the
/// result is that buffer. Without in-place storage the clone stays all zeros, and every step
/// holds two copies of every row's cache at once.
#[test]
fn a_decode_step_updates_the_callers_cache_buffers_in_place() {
    use switchyard_phi4mm::iree::context::{IreeContext, Rows};
    use switchyard_phi4mm::iree::emit::decoder::{
        cache_type, emit, Adapters, DecoderFn, DecoderShape, Kind,
    };

    let ck = switchyard_phi4mm::checkpoint::Checkpoint::open(&fixture().join("model")).unwrap();
    let c = &ck.config.text;
    let shape = DecoderShape::new(512, CHUNK, &[1]);
    let size = shape.buckets[0];
    let module = emit(&ck, &shape);
    let bytes = crate::iree_support::context()
        .module_bytes(
            Rows::Few,
            "decoder",
            &format!("in-place test decoder sizes={:?}", shape.buckets),
            &module.mlir,
            &module.weights,
        )
        .unwrap();
    let rt = IreeContext::runtime(crate::iree_support::device()).unwrap();
    let program = rt.load_vmfb(&bytes).unwrap();
    let f = program
        .function(&format!(
            "decoder.{}",
            DecoderFn {
                kind: Kind::Decode { b: 1 },
                size,
                adapters: Adapters::Base,
            }
            .name()
        ))
        .unwrap();

    let (h, half) = (c.hidden_size, c.rotary_dim / 2);
    let cache = cache_type(c, size).shape;
    let zeros = vec![0.0f32; cache.iter().product()];
    let k = rt.buffer_view(&cache, &zeros).unwrap();
    let v = rt.buffer_view(&cache, &zeros).unwrap();
    let (k_before, v_before) = (k.clone(), v.clone());
    let pos = 5usize;
    let x: Vec<f32> = (0..h).map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.5).collect();
    let mut args: Vec<eerie::runtime::Value> = module.weights.upload(&rt).unwrap();
    args.push(rt.buffer_view(&[1, h], &x).unwrap().into());
    args.push(rt.buffer_view(&[1], &[pos as i32]).unwrap().into());
    args.push(
        rt.buffer_view(&[1, half], &vec![1.0f32; half])
            .unwrap()
            .into(),
    );
    args.push(
        rt.buffer_view(&[1, half], &vec![0.0f32; half])
            .unwrap()
            .into(),
    );
    args.push(rt.buffer_view(&[1, 2], &[0.0f32, 0.0]).unwrap().into());
    args.push(k.into());
    args.push(v.into());
    let out = f.invoke(args).unwrap();
    assert_eq!(out.len(), 3, "logits, k, v");

    let hd = c.head_dim;
    for (name, before, result) in [("k", &k_before, &out[1]), ("v", &v_before, &out[2])] {
        let result: eerie::runtime::BufferView<f32> = result.clone().try_into().unwrap();
        let (seen, returned) = (before.read().unwrap(), result.read().unwrap());
        assert_eq!(
            seen, returned,
            "{name}: the result is not the caller's buffer"
        );
        // [layers, kv_heads, size, head_dim]: position `pos` of every head was written, and
        // nothing else.
        for (i, &val) in seen.iter().enumerate() {
            let p = (i / hd) % size;
            if p != pos {
                assert_eq!(val, 0.0, "{name}: element {i} (position {p}) written");
            }
        }
        let written = seen
            .chunks_exact(hd)
            .enumerate()
            .filter(|(j, row)| j % size == pos && row.iter().any(|&x| x != 0.0))
            .count();
        assert_eq!(
            written,
            c.num_layers * c.num_kv_heads,
            "{name}: heads written at {pos}"
        );
    }
}

/// Both fixture `mixed_batches` on the suite's device, for each way a compile target has the
/// decoder write its products (`Products`: the CPU's weights in tiles, in either register
/// shape, and CUDA's matrix-vector products, weight-major for a prefill chunk, which run here on
/// the CPU too, so CI checks their math): all rows prefilled in one step, then decoded
/// together, one token per row per step, each with its own adapter. First-step logits within the fixture tolerance of the reference,
/// the 8 greedy tokens of every row exact. Besides the two batches as the fixture has them
/// (each with a text, a speech and a vision row), pairs of their rows: one adapter beside a text
/// row (the functions with both adapters, masked per row), and two text rows (the functions
/// with none).
#[test]
fn both_mixed_batches_in_every_product_form() {
    use switchyard_phi4mm::adapter::AdapterChoice;
    use switchyard_phi4mm::checkpoint::Checkpoint;
    use switchyard_phi4mm::iree::decoder::IreeDecoder;
    use switchyard_phi4mm::iree::emit::decoder::DecoderShape;
    use switchyard_phi4mm::iree::mlir::Products;
    use switchyard_phi4mm::iree::tiles::TileShape;
    use switchyard_phi4mm::model::{Phi4mm, PromptInput};

    let ck = Checkpoint::open(&fixture().join("model")).unwrap();
    let host = Phi4mm::load(&ck, 2);
    let manifest = manifest();
    // Every form with the decode batch sizes the decoder compiles; rows short of the fixture's
    // LongRoPE cases, so a small context keeps the three compiles short.
    // No target chooses `RowMajor` or `WeightMajor` alone for the decoder, and each form's
    // compile is most of this test's time, so they are left out.
    let forms = [
        Products::Tiles(TileShape::AVX512),
        Products::Tiles(TileShape::AVX2),
        Products::RowMatvecs,
    ];
    let shape = |products| DecoderShape::new(2048, CHUNK, &[1, 2, 4, 8]).with_products(products);
    let ctx = crate::iree_support::context();
    // Every module into the cache before any runs: a cache for a GPU can be filled without one.
    for products in forms {
        IreeDecoder::module(&ck, ctx, &shape(products)).unwrap();
    }
    for products in forms {
        let dec = IreeDecoder::load_shape(&ck, ctx, shape(products)).unwrap();
        let (audio, image) = ("mixed_audio_text", "mixed_image_text");
        let row_sets: [&[(&str, usize)]; 5] = [
            &[(audio, 0), (audio, 1), (audio, 2)],
            &[(image, 0), (image, 1), (image, 2)],
            // text_base beside audio_speech; image_vision beside text_base; two text_base.
            &[(audio, 0), (audio, 1)],
            &[(image, 0), (image, 2)],
            &[(audio, 0), (image, 2)],
        ];
        for set in row_sets {
            let what = |r: usize| format!("{products:?} {set:?} row {r}");
            let prompts: Vec<_> = set
                .iter()
                .map(|&(batch, r)| {
                    let b = &manifest["mixed_batches"][batch];
                    let case = b["rows"][r].as_str().unwrap();
                    let adapter = b["adapter_names"][r].as_str().unwrap();
                    let mut input: PromptInput = case_input(case);
                    input.adapter = AdapterChoice::Fixed(adapter_mode(adapter));
                    (case, host.prepare(&input, 8).unwrap())
                })
                .collect();
            let mut states: Vec<_> = prompts.iter().map(|_| dec.new_state()).collect();
            let mut inputs: Vec<Vec<f32>> = prompts.iter().map(|(_, p)| p.embeds.clone()).collect();
            let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
            for step in 0..8 {
                let mut batch_rows: Vec<StepRow<_>> = states
                    .iter_mut()
                    .zip(&inputs)
                    .zip(&prompts)
                    .map(|((state, embeds), (_, p))| StepRow {
                        state,
                        embeds,
                        adapter: p.adapter,
                    })
                    .collect();
                let logits = dec.step(&mut batch_rows);
                for (r, l) in logits.iter().enumerate() {
                    if step == 0 {
                        let case = prompts[r].0;
                        let (want, _) = model_cases().f32(&format!("{case}.logits_first"));
                        assert_matches_reference(&what(r), l, &want, 1e-4, 1e-4);
                    }
                    tokens[r].push(argmax(l));
                }
                inputs = tokens
                    .iter()
                    .map(|t| dec.embed(&t[t.len() - 1..]))
                    .collect();
            }
            for (r, (got, &(batch, row))) in tokens.iter().zip(set).enumerate() {
                assert_eq!(got, &mixed_row_tokens(batch, row), "{}", what(r));
            }
        }
    }
}
