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
