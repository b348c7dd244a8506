//! The whole IREE backend — compiled vision tower, audio encoder and decoder — on every model
//! case of the fixture, both checkpoint layouts: the media stage with the IREE encoders, then
//! greedy decoding on the IREE decoder. First-step logits within the fixture tolerance of the
//! reference and of the host backend, greedy tokens identical to both.

use std::sync::Arc;

use crate::model_support::*;
use switchyard_phi4mm::adapter::AdapterChoice;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::Phi4mm;
use switchyard_phi4mm::step::greedy;

fn run(layout: &str) {
    let ck = Checkpoint::open(&fixture().join(layout)).expect("fixture checkpoint");
    let host = Arc::new(Phi4mm::load(&ck, 2));
    let iree = crate::iree_support::backend(&ck, host.clone());
    let refs = model_cases();
    let cases = manifest()["model_cases"]["cases"].as_object().unwrap();
    for case in cases.keys() {
        let t = |n: &str| format!("{case}.{n}");
        let mut input = case_input(case);
        input.adapter = AdapterChoice::Fixed(case_adapter(case));
        let prepared = host
            .prepare_with(&input, 8, iree.encoders(), iree.context())
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        if refs.has(&t("inputs_embeds")) {
            let (want, _) = refs.f32(&t("inputs_embeds"));
            assert_matches_reference(
                &format!("{layout} {case} inputs_embeds"),
                &prepared.embeds,
                &want,
                1e-4,
                0.0,
            );
        }
        let got = greedy(&iree, &prepared.embeds, prepared.adapter, 8, &[]);
        assert_matches_case(&format!("{layout} {case}"), case, &got);
        let host_prepared = host.prepare(&input, 8).unwrap();
        let host_out = host_greedy(&host, &host_prepared, 8);
        assert_matches_reference(
            &format!("{layout} {case} logits_first vs host"),
            &got.logits_first,
            &host_out.logits_first,
            1e-4,
            1e-4,
        );
        assert_eq!(
            got.tokens, host_out.tokens,
            "{layout} {case} tokens vs host"
        );
    }
}

#[test]
fn every_case_native_layout() {
    run("model");
}

#[test]
fn every_case_original_layout() {
    run("model-original");
}
