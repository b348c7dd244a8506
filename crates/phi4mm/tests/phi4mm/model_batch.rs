//! The decoder step as the scheduler will use it: rows with different adapters, lengths and
//! positions in one batch each reproduce their solo results (fixture `mixed_batches`), and input
//! validation refuses bad requests before compute.

use crate::model_support::*;
use switchyard_phi4mm::adapter::AdapterChoice;
use switchyard_phi4mm::checkpoint::Checkpoint;
use switchyard_phi4mm::model::{InputError, MergedPrompt, Phi4mm, PromptInput};
use switchyard_phi4mm::sampling::argmax;
use switchyard_phi4mm::step::StepRow;

fn load() -> Phi4mm {
    Phi4mm::load(&Checkpoint::open(&fixture().join("model")).unwrap(), 2)
}

fn prepared(model: &Phi4mm, case: &str, adapter: &str) -> MergedPrompt {
    let m = &manifest()["model_cases"]["cases"][case];
    let ids: Vec<u32> = model_cases()
        .i64(&format!("{case}.input_ids"))
        .0
        .iter()
        .map(|&i| i as u32)
        .collect();
    let audios = m["audios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| audio_input(a.as_str().unwrap()))
        .collect();
    let images = m["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| image_input(i["name"].as_str().unwrap()))
        .collect();
    let mode = adapter_mode(adapter);
    model
        .prepare(
            &PromptInput {
                input_ids: ids,
                images,
                audios,
                adapter: AdapterChoice::Fixed(mode),
            },
            8,
        )
        .unwrap()
}

/// Runs a whole mixed batch through `Decoder::step`: all rows prefilled in one step, then
/// decoded together, one token per row per step.
fn run_mixed(batch: &str) {
    let model = load();
    let b = &manifest()["mixed_batches"][batch];
    let cases: Vec<&str> = b["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let adapters: Vec<&str> = b["adapter_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let prompts: Vec<MergedPrompt> = cases
        .iter()
        .zip(&adapters)
        .map(|(c, a)| prepared(&model, c, a))
        .collect();
    let mut states: Vec<_> = prompts
        .iter()
        .map(|_| model.decoder.new_sequence())
        .collect();
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    model.install(|| {
        let mut inputs: Vec<Vec<f32>> = prompts.iter().map(|p| p.embeds.clone()).collect();
        for step in 0..8 {
            let mut rows: Vec<StepRow<_>> = states
                .iter_mut()
                .zip(&inputs)
                .zip(&prompts)
                .map(|((state, embeds), p)| StepRow {
                    state,
                    embeds,
                    adapter: p.adapter,
                })
                .collect();
            let logits = model.decoder.step(&mut rows);
            for (r, l) in logits.iter().enumerate() {
                if step == 0 {
                    let (want, _) = model_cases().f32(&format!("{}.logits_first", cases[r]));
                    assert_matches_reference(
                        &format!("{batch} row {r} logits_first"),
                        l,
                        &want,
                        1e-4,
                        1e-4,
                    );
                }
                tokens[r].push(argmax(l));
            }
            inputs = tokens
                .iter()
                .map(|t| model.decoder.embed(&t[t.len() - 1..]))
                .collect();
        }
    });
    for (r, row_tokens) in tokens.iter().enumerate() {
        let want = mixed_row_tokens(batch, r);
        assert_eq!(row_tokens, &want, "{batch} row {r} ({})", cases[r]);
    }
}

#[test]
fn mixed_audio_text_batch_matches_solo_rows() {
    run_mixed("mixed_audio_text");
}

#[test]
fn mixed_image_text_batch_matches_solo_rows() {
    run_mixed("mixed_image_text");
}

#[test]
fn bad_inputs_are_refused_before_compute() {
    let model = load();
    let base = |ids: Vec<u32>| PromptInput {
        input_ids: ids,
        ..Default::default()
    };
    // One audio placeholder too few for the clip's 27 rows.
    let mut p = base(vec![1021, 1011, 1020, 1019]);
    p.audios.push(audio_input("audio_16k"));
    assert!(matches!(
        model.prepare(&p, 8),
        Err(InputError::PlaceholderMismatch {
            kind: "audio",
            placeholders: 1,
            rows: 27,
            ..
        })
    ));
    // Non-finite features.
    let mut a = audio_input("audio_16k");
    a.features[5] = f32::NAN;
    let mut ids = vec![1021];
    ids.extend(std::iter::repeat_n(1011, 27));
    let mut p = base(ids.clone());
    p.audios.push(a);
    assert!(matches!(
        model.prepare(&p, 8),
        Err(InputError::NonFinite { index: 5, .. })
    ));
    // Image placeholders that do not match the image's 477 rows.
    let mut p = base(ids);
    p.images.push(image_input("img_small"));
    assert!(matches!(
        model.prepare(&p, 8),
        Err(InputError::PlaceholderMismatch {
            kind: "image",
            rows: 477,
            ..
        })
    ));
    // Prompt + new tokens beyond the context.
    let ctx = model.config.text.max_position_embeddings;
    assert!(matches!(
        model.prepare(&base(vec![5; 10]), ctx),
        Err(InputError::ContextOverflow { prompt: 10, .. })
    ));
    // Token id outside the vocabulary.
    assert!(matches!(
        model.prepare(&base(vec![5, 4096]), 1),
        Err(InputError::TokenOutOfRange {
            id: 4096,
            position: 1,
            ..
        })
    ));
}
