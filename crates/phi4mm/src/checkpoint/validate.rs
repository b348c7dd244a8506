//! Whole-checkpoint validation against the schema the config implies: unexpected and missing
//! tensors, exact shapes, LoRA pairs/ranks/bases, and every value finite.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::config::ModelConfig;
use super::error::{CheckpointError, Result};
use super::layout::{self, LoraAdapter, LORA_TARGETS};
use super::progress::Progress;
use super::schema::{self, Need};
use super::store::TensorView;

/// Validates `tensors` against the schema of `c`; every value too when `values` is `Some`
/// (then with that progress).
pub fn validate(
    c: &ModelConfig,
    tensors: &BTreeMap<String, TensorView>,
    values: Option<Progress>,
) -> Result<()> {
    // 0. The schema is built from the config's layer counts. Each layer has several tensors, so
    //    a count above the number of tensors cannot be backed, and building its schema could
    //    take the process's memory (a typo of 50,000,000 layers aborted a serving host's reload).
    for (key, layers) in [
        ("num_hidden_layers", c.text.num_layers),
        ("vision_config.num_hidden_layers", c.vision.num_layers),
        ("audio_config.num_blocks", c.audio.num_blocks),
    ] {
        if layers > tensors.len() {
            return Err(CheckpointError::InvalidConfig {
                key: key.into(),
                reason: format!(
                    "{layers} layers, more than the checkpoint's {} tensors",
                    tensors.len()
                ),
            });
        }
    }
    let schema = schema::expected_schema(c);
    let source = |name: &str| tensors[name].source.display().to_string();

    // 1. Every stored base tensor is in the schema with its exact shape (checked before the
    //    LoRA tensors, so a config contradicting the tensors is reported at the base weight).
    for (name, view) in tensors {
        if layout::parse_lora_name(name).is_some() {
            continue;
        }
        match schema.get(name) {
            Some((expected, _)) if *expected != view.shape => {
                return Err(CheckpointError::ShapeMismatch {
                    tensor: name.clone(),
                    expected: expected.clone(),
                    found: view.shape.clone(),
                })
            }
            Some(_) => {}
            None => {
                return Err(CheckpointError::UnexpectedTensor {
                    tensor: name.clone(),
                    source_file: source(name),
                })
            }
        }
    }

    // 2. Every LoRA tensor has its base, its pair, the configured rank and the exact shape.
    for (name, view) in tensors {
        let Some((layer, module_path, ab, adapter)) = layout::parse_lora_name(name) else {
            continue;
        };
        let base = format!("{module_path}.weight");
        if !tensors.contains_key(&base) {
            return Err(CheckpointError::LoraWithoutBase {
                tensor: name.clone(),
                base,
            });
        }
        let module = module_path.splitn(4, '.').nth(3).unwrap_or("");
        let (Some(_layer), Some(adapter), Some((din, dout))) =
            (layer, adapter, schema::module_dims(c, module))
        else {
            return Err(CheckpointError::UnexpectedTensor {
                tensor: name.clone(),
                source_file: source(name),
            });
        };
        let Some(cfg) = c.lora(adapter) else {
            return Err(CheckpointError::UnexpectedTensor {
                tensor: format!("{name} (no {} adapter config)", adapter.as_str()),
                source_file: source(name),
            });
        };
        let other = if ab == 'A' { 'B' } else { 'A' };
        let pair = name.replace(&format!(".lora_{ab}."), &format!(".lora_{other}."));
        if !tensors.contains_key(&pair) {
            return Err(CheckpointError::IncompleteLoraPair {
                present: name.clone(),
                missing: pair,
            });
        }
        let shape = &view.shape;
        let rank = if ab == 'A' {
            shape.first()
        } else {
            shape.get(1)
        };
        if shape.len() == 2 && rank != Some(&cfg.r) {
            return Err(CheckpointError::RankMismatch {
                tensor: name.clone(),
                adapter: adapter.as_str(),
                expected: cfg.r,
                found: *rank.expect("2-d"),
            });
        }
        let expected = if ab == 'A' {
            vec![cfg.r, din]
        } else {
            vec![dout, cfg.r]
        };
        if *shape != expected {
            return Err(CheckpointError::ShapeMismatch {
                tensor: name.clone(),
                expected,
                found: shape.clone(),
            });
        }
    }

    // 3. Nothing required is missing, and each configured adapter covers every target module.
    // The first in the order a person reads (`layers.2` before `layers.10`): with too many
    // layers configured, that is the first layer the checkpoint lacks.
    let missing = schema
        .iter()
        .filter(|(name, (_, need))| *need == Need::Required && !tensors.contains_key(*name))
        .map(|(name, _)| name)
        .min_by_key(|name| reading_order(name));
    if let Some(name) = missing {
        return Err(CheckpointError::MissingTensor {
            tensor: name.clone(),
        });
    }
    for adapter in LoraAdapter::ALL {
        if c.lora(adapter).is_none() {
            continue;
        }
        for layer in 0..c.text.num_layers {
            for module in LORA_TARGETS {
                for ab in ['A', 'B'] {
                    let name = layout::lora_name(layer, module, ab, adapter);
                    if !tensors.contains_key(&name) {
                        return Err(CheckpointError::MissingTensor { tensor: name });
                    }
                }
            }
        }
    }

    // 4. Every value finite: one pass over all bytes, in parallel, reporting progress.
    let Some(progress) = values else {
        return Ok(());
    };
    let total: u64 = tensors.values().map(|t| t.size_bytes() as u64).sum();
    let done = AtomicU64::new(0);
    let bad = tensors
        .par_iter()
        .filter_map(|(name, view)| {
            let r = view
                .first_non_finite()
                .map(|(index, value)| (name.clone(), index, value));
            let d = done.fetch_add(view.size_bytes() as u64, Ordering::Relaxed)
                + view.size_bytes() as u64;
            progress(d, total);
            r
        })
        .min_by(|a, b| a.0.cmp(&b.0));
    if let Some((tensor, index, value)) = bad {
        return Err(CheckpointError::NonFinite {
            tensor,
            index,
            value,
        });
    }
    Ok(())
}

/// A tensor name's segments, numbers as numbers: the order a person reads names in.
fn reading_order(name: &str) -> Vec<std::result::Result<u64, &str>> {
    name.split('.')
        .map(|segment| segment.parse::<u64>().map_err(|_| segment))
        .collect()
}
