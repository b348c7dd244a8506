//! The IREE audio encoder against the fixture and the host encoder, both checkpoint layouts:
//! every audio case's encoder output (fixture `audio_encoder_out`, or the host's where the
//! fixture has none), its projected rows at the audio placeholders (fixture `inputs_embeds`, or
//! the host's projection), and both projection branches against the host encoder.

use crate::model_support::*;
use switchyard_fixtures::max_abs_diff;
use switchyard_phi4mm::adapter::AudioBranch;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::iree::audio::IreeAudio;
use switchyard_phi4mm::model::AudioEncoder;

const TOL: f32 = 1e-4;

fn branch_of(case: &str) -> AudioBranch {
    let m = &manifest()["model_cases"]["cases"][case];
    if m["images"].as_array().unwrap().is_empty() {
        AudioBranch::Speech
    } else {
        AudioBranch::Vision
    }
}

fn run(layout: &str) {
    let ck = Checkpoint::open(&fixture().join(layout)).expect("fixture checkpoint");
    let audio = IreeAudio::load(&ck, crate::iree_support::context()).expect("IREE audio encoder");
    let host = AudioEncoder::load(&ck);
    let audio_token = ck.config.audio_token_id;
    let h = ck.config.text.hidden_size;
    let refs = model_cases();
    let cases = manifest()["model_cases"]["cases"].as_object().unwrap();
    let mut checked = 0;
    for (case, m) in cases {
        let clips = m["audios"].as_array().unwrap();
        if clips.is_empty() {
            continue;
        }
        checked += 1;
        let t = |n: &str| format!("{case}.{n}");
        let branch = branch_of(case);
        let mut enc_out = Vec::new();
        let mut rows = Vec::new();
        for clip in clips {
            let input = audio_input(clip.as_str().unwrap());
            for b in [AudioBranch::Speech, AudioBranch::Vision] {
                let got = audio
                    .encode(&input.features, input.frames, b)
                    .expect("IREE encode");
                let want = host.encode(&input.features, input.frames, b);
                assert_eq!(got.tokens, want.tokens, "{layout} {case} tokens");
                assert_matches_reference(
                    &format!("{layout} {case} {b:?} encoder_out vs host"),
                    &got.encoder_out,
                    &want.encoder_out,
                    TOL,
                    0.0,
                );
                assert_matches_reference(
                    &format!("{layout} {case} {b:?} projection vs host"),
                    &got.embeds,
                    &want.embeds,
                    TOL,
                    0.0,
                );
                eprintln!(
                    "{layout} {case} {b:?}: max |Δ| vs host encoder {:.2e}, projection {:.2e}",
                    max_abs_diff(&got.encoder_out, &want.encoder_out),
                    max_abs_diff(&got.embeds, &want.embeds)
                );
                if b == branch {
                    enc_out.extend_from_slice(&got.encoder_out);
                    rows.extend_from_slice(&got.embeds);
                }
            }
        }
        if refs.has(&t("audio_encoder_out")) {
            let (want, _) = refs.f32(&t("audio_encoder_out"));
            eprintln!(
                "{layout} {case}: max |Δ| vs fixture audio_encoder_out {:.2e}",
                max_abs_diff(&enc_out, &want)
            );
            assert_matches_reference(
                &format!("{layout} {case} audio_encoder_out"),
                &enc_out,
                &want,
                TOL,
                0.0,
            );
        }
        if refs.has(&t("inputs_embeds")) {
            let (want, _) = refs.f32(&t("inputs_embeds"));
            let ids = refs.i64(&t("input_ids")).0;
            let want_rows: Vec<f32> = ids
                .iter()
                .enumerate()
                .filter(|(_, &id)| id as u32 == audio_token)
                .flat_map(|(i, _)| want[i * h..(i + 1) * h].iter().copied())
                .collect();
            eprintln!(
                "{layout} {case}: max |Δ| vs fixture audio rows {:.2e}",
                max_abs_diff(&rows, &want_rows)
            );
            assert_matches_reference(
                &format!("{layout} {case} audio rows of inputs_embeds"),
                &rows,
                &want_rows,
                TOL,
                0.0,
            );
        }
    }
    assert_eq!(checked, 5, "audio cases");
}

/// Clip lengths the fixture cases miss, cut from (and tiled from) the long clip, against the
/// host: one frame, subsampler chunk edges (t = 128, 129; frames not a multiple of 8; t = 256,
/// 257, the first clip in a large chunk, and 385, a large chunk and a small one), window buckets
/// filled exactly (t = 64, 128, 256) and by one row more (t = 65, 129, 257; t = 75 pads 53 rows),
/// and three attention windows (t = 1009: large, large, small, small chunks).
#[test]
fn chunk_and_window_edges_match_host() {
    let ck = Checkpoint::open(&fixture().join("model")).expect("fixture checkpoint");
    let audio = IreeAudio::load(&ck, crate::iree_support::context()).expect("IREE audio encoder");
    let host = AudioEncoder::load(&ck);
    let long = audio_input("audio_long_16k");
    let fin = ck.config.audio.input_size;
    let mut tiled = long.features.clone();
    tiled.extend_from_slice(&long.features);
    for frames in [
        1,
        7,
        512,
        513,
        600,
        1023,
        1024,
        1025,
        1031,
        2048,
        2049,
        3073,
        2 * long.frames,
    ] {
        let features = &tiled[..frames * fin];
        let got = audio
            .encode(features, frames, AudioBranch::Speech)
            .expect("IREE encode");
        let want = host.encode(features, frames, AudioBranch::Speech);
        assert_eq!(got.tokens, want.tokens, "{frames} frames: tokens");
        assert_matches_reference(
            &format!("{frames} frames: encoder_out"),
            &got.encoder_out,
            &want.encoder_out,
            TOL,
            0.0,
        );
        assert_matches_reference(
            &format!("{frames} frames: projection"),
            &got.embeds,
            &want.embeds,
            TOL,
            0.0,
        );
        eprintln!(
            "{frames} frames ({} rows): max |Δ| encoder {:.2e}, projection {:.2e}",
            got.tokens,
            max_abs_diff(&got.encoder_out, &want.encoder_out),
            max_abs_diff(&got.embeds, &want.embeds)
        );
    }
}

#[test]
fn iree_audio_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<IreeAudio>();
}

#[test]
fn every_audio_case_native_layout() {
    run("model");
}

#[test]
fn every_audio_case_original_layout() {
    run("model-original");
}
