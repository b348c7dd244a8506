//! Checkpoint loading of both fixture layouts, and refusal of bad checkpoints before any compute.

use std::path::Path;

use crate::model_support::fixture;
use safetensors::{Dtype, SafeTensors};
use switchyard_phi4mm::checkpoint::{Checkpoint, CheckpointError, Layout, LoraAdapter};

#[test]
fn both_layouts_load_to_identical_tensors() {
    let native = Checkpoint::open(&fixture().join("model")).expect("transformers layout");
    let original = Checkpoint::open(&fixture().join("model-original")).expect("original layout");
    assert_eq!(native.layout, Layout::Transformers);
    assert_eq!(original.layout, Layout::Original);
    let names_a: Vec<_> = native.tensor_names().collect();
    let names_b: Vec<_> = original.tensor_names().collect();
    assert_eq!(names_a, names_b);
    assert_eq!(names_a.len(), 211);
    for name in names_a {
        assert_eq!(
            native.tensor(name).to_f32_vec(),
            original.tensor(name).to_f32_vec(),
            "{name}"
        );
    }
    let c = &native.config;
    assert_eq!(c.text.hidden_size, 48);
    assert_eq!(c.text.rotary_dim, 6);
    assert_eq!((c.image_token_id, c.audio_token_id), (1010, 1011));
    assert_eq!(c.audio.bias_max_distance, 16);
    assert_eq!(c.speech_lora.unwrap().r, 6);
    assert_eq!(c.vision_lora.unwrap().scale(), 2.0);
    let mut eos = c.eos_token_ids.clone();
    eos.sort();
    assert_eq!(eos, vec![1000, 1020]);
    // The configs of both layouts describe the same model.
    assert_eq!(native.config.text, original.config.text);
    assert_eq!(native.config.vision, original.config.vision);
    assert_eq!(native.config.audio, original.config.audio);
    assert_eq!(native.config.speech_lora, original.config.speech_lora);
    assert!(native
        .lora(1, "mlp.down_proj", LoraAdapter::Speech)
        .is_some());
}

// ---------------------------------------------------------------------------------------------
// Bad checkpoints, each built in a temp dir from a copy of the fixture.

/// One tensor of a safetensors file being rewritten.
pub(crate) struct Entry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Copies a fixture layout into a fresh temp dir.
pub(crate) fn copy_layout(layout: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fixture().join(layout), tmp.path());
    tmp
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Rewrites a safetensors file through `edit` (with the `safetensors` crate).
pub(crate) fn rewrite(path: &Path, edit: impl FnOnce(&mut Vec<Entry>)) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut entries: Vec<Entry> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| Entry {
            name,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            data: t.data().to_vec(),
        })
        .collect();
    edit(&mut entries);
    let views: Vec<(String, safetensors::tensor::TensorView)> = entries
        .iter()
        .map(|e| {
            (
                e.name.clone(),
                safetensors::tensor::TensorView::new(e.dtype, e.shape.clone(), &e.data).unwrap(),
            )
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

pub(crate) fn entry<'a>(entries: &'a mut [Entry], name: &str) -> &'a mut Entry {
    entries
        .iter_mut()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name}"))
}

/// Random-ish bf16 bytes for a new tensor of `n` elements (value 0.5).
fn bf16_bytes(n: usize) -> Vec<u8> {
    std::iter::repeat_n(0x3f00u16.to_le_bytes(), n)
        .flatten()
        .collect()
}

fn open_err(dir: &Path) -> CheckpointError {
    Checkpoint::open(dir).expect_err("bad checkpoint must be refused")
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

const SPEECH_ADAPTER: &str = "speech-lora/adapter_model.safetensors";

#[test]
fn missing_lora_b_is_refused_in_peft_folder() {
    let tmp = copy_layout("model");
    rewrite(&tmp.path().join(SPEECH_ADAPTER), |e| {
        e.retain(|t| t.name != "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight")
    });
    match open_err(tmp.path()) {
        CheckpointError::IncompleteLoraPair { present, missing } => {
            assert_eq!(present, "model.layers.1.mlp.down_proj.lora_A.speech.weight");
            assert_eq!(missing, "model.layers.1.mlp.down_proj.lora_B.speech.weight");
        }
        e => panic!("wrong error: {e}"),
    }
    // The settings check's open, from the headers alone, refuses it the same way.
    assert!(matches!(
        Checkpoint::open_structure(tmp.path()),
        Err(CheckpointError::IncompleteLoraPair { .. })
    ));
}

#[test]
fn missing_lora_b_is_refused_in_original_shard() {
    let tmp = copy_layout("model-original");
    let name = "model.layers.0.self_attn.o_proj.lora_B.vision.weight";
    let index_path = tmp.path().join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    let shard = index["weight_map"][name].as_str().unwrap().to_string();
    index["weight_map"].as_object_mut().unwrap().remove(name);
    std::fs::write(&index_path, index.to_string()).unwrap();
    rewrite(&tmp.path().join(shard), |e| e.retain(|t| t.name != name));
    let err = open_err(tmp.path());
    assert!(
        matches!(&err, CheckpointError::IncompleteLoraPair { missing, .. } if missing == name),
        "{err}"
    );
    assert!(err.to_string().contains(name));
}

#[test]
fn rank_mismatch_is_refused() {
    let tmp = copy_layout("model");
    let a = "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight";
    let b = "base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight";
    rewrite(&tmp.path().join(SPEECH_ADAPTER), |e| {
        let ea = entry(e, a);
        ea.shape = vec![5, 48];
        ea.data = bf16_bytes(5 * 48);
        let eb = entry(e, b);
        eb.shape = vec![80, 5];
        eb.data = bf16_bytes(80 * 5);
    });
    match open_err(tmp.path()) {
        CheckpointError::RankMismatch {
            tensor,
            adapter,
            expected,
            found,
        } => {
            assert_eq!(
                tensor,
                "model.layers.0.self_attn.qkv_proj.lora_A.speech.weight"
            );
            assert_eq!((adapter, expected, found), ("speech", 6, 5));
        }
        e => panic!("wrong error: {e}"),
    }
}

#[test]
fn nan_in_one_weight_is_refused() {
    let tmp = copy_layout("model");
    let name = "model.layers.1.mlp.down_proj.weight";
    rewrite(&tmp.path().join("model.safetensors"), |e| {
        // bf16 NaN at element 77.
        entry(e, name).data[154..156].copy_from_slice(&0x7fc0u16.to_le_bytes());
    });
    match open_err(tmp.path()) {
        CheckpointError::NonFinite {
            tensor,
            index,
            value,
        } => {
            assert_eq!((tensor.as_str(), index), (name, 77));
            assert!(value.is_nan());
        }
        e => panic!("wrong error: {e}"),
    }
    // The values are the one thing the settings check's open leaves to the full one.
    Checkpoint::open_structure(tmp.path()).expect("the structure is sound");
}

#[test]
fn inf_in_original_shard_is_refused() {
    let tmp = copy_layout("model-original");
    let stored =
        "model.embed_tokens_extend.audio_embed.encoder.encoders.0.self_attn.linear_q.weight";
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let shard = index["weight_map"][stored].as_str().unwrap();
    rewrite(&tmp.path().join(shard), |e| {
        entry(e, stored).data[0..2].copy_from_slice(&0xff80u16.to_le_bytes());
    });
    let err = open_err(tmp.path());
    // Reported under the canonical (transformers) name the original key maps to.
    assert!(
        matches!(&err, CheckpointError::NonFinite { tensor, index: 0, .. }
            if tensor == "model.embed_tokens_extend.audio_embed.encoder.encoders.0.self_attn.q_proj.weight"),
        "{err}"
    );
}

#[test]
fn truncated_shard_is_refused() {
    let tmp = copy_layout("model-original");
    let shard = tmp.path().join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    // The first tensor (in file order) whose bytes were cut.
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let cut_at = bytes.as_ptr() as usize + bytes.len() - 100;
    let (last, _) = st
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.data().as_ptr() as usize + t.data().len() > cut_at)
        .min_by_key(|(_, t)| t.data().as_ptr() as usize)
        .unwrap();
    match open_err(tmp.path()) {
        CheckpointError::TruncatedShard { path, tensor, .. } => {
            assert_eq!(path, shard);
            assert_eq!(tensor, last);
        }
        e => panic!("wrong error: {e}"),
    }
}

#[test]
fn wrong_shape_is_refused() {
    let tmp = copy_layout("model");
    let name = "model.embed_tokens_extend.audio_embed.encoder.embed.out.weight";
    rewrite(&tmp.path().join("model.safetensors"), |e| {
        let t = entry(e, name);
        t.shape = vec![32, 150];
        t.data = bf16_bytes(32 * 150);
    });
    match open_err(tmp.path()) {
        CheckpointError::ShapeMismatch {
            tensor,
            expected,
            found,
        } => {
            assert_eq!(tensor, name);
            assert_eq!((expected, found), (vec![32, 160], vec![32, 150]));
        }
        e => panic!("wrong error: {e}"),
    }
}

#[test]
fn config_contradicting_tensors_is_refused() {
    // 3 KV heads instead of 2: the fused qkv projection no longer has the implied rows.
    let tmp = copy_layout("model");
    edit_config(tmp.path(), |c| c["num_key_value_heads"] = 3.into());
    let err = open_err(tmp.path());
    assert!(
        matches!(&err, CheckpointError::ShapeMismatch { tensor, expected, found }
            if tensor == "model.layers.0.self_attn.qkv_proj.weight" && expected == &vec![96, 48] && found == &vec![80, 48]),
        "{err}"
    );

    // More layers than stored: the first missing tensor is named.
    let tmp = copy_layout("model-original");
    edit_config(tmp.path(), |c| c["num_hidden_layers"] = 3.into());
    let err = open_err(tmp.path());
    assert!(
        matches!(&err, CheckpointError::MissingTensor { tensor } if tensor.starts_with("model.layers.2.")),
        "{err}"
    );
    // With twelve, still layer 2 (not `layers.10`, which sorts first as text).
    let tmp = copy_layout("model-original");
    edit_config(tmp.path(), |c| c["num_hidden_layers"] = 12.into());
    let err = open_err(tmp.path());
    assert!(
        matches!(&err, CheckpointError::MissingTensor { tensor } if tensor.starts_with("model.layers.2.")),
        "{err}"
    );

    // Layer counts no checkpoint of this size could back are refused before the schema is
    // built from them (which once took the process's memory).
    for (key, edit) in [
        (
            "num_hidden_layers",
            (|c: &mut serde_json::Value| c["num_hidden_layers"] = 50_000_000.into())
                as fn(&mut serde_json::Value),
        ),
        ("audio_config.num_blocks", |c| {
            c["audio_config"]["num_blocks"] = 1_000_000.into()
        }),
        ("vision_config.num_hidden_layers", |c| {
            c["vision_config"]["num_hidden_layers"] = 1_000_000.into()
        }),
    ] {
        let tmp = copy_layout("model");
        edit_config(tmp.path(), edit);
        let err = open_err(tmp.path());
        assert!(
            matches!(&err, CheckpointError::InvalidConfig { key: k, reason }
                if k == key && reason.contains("more than the checkpoint's")),
            "{key}: {err}"
        );
    }

    // Fewer layers than stored: layer 1's tensors are unexpected.
    let tmp = copy_layout("model");
    edit_config(tmp.path(), |c| c["num_hidden_layers"] = 1.into());
    let err = open_err(tmp.path());
    assert!(err.to_string().contains("model.layers.1."), "{err}");

    // A LoRA config rank that the adapter tensors do not have.
    let tmp = copy_layout("model-original");
    edit_config(tmp.path(), |c| c["vision_lora"]["r"] = 8.into());
    let err = open_err(tmp.path());
    assert!(
        matches!(&err, CheckpointError::RankMismatch { tensor, expected: 8, found: 4, .. }
            if tensor == "model.layers.0.mlp.down_proj.lora_A.vision.weight"),
        "{err}"
    );
}

#[test]
fn lora_without_base_weight_is_refused() {
    let tmp = copy_layout("model");
    rewrite(&tmp.path().join(SPEECH_ADAPTER), |e| {
        for (ab, shape) in [("A", vec![6, 48]), ("B", vec![48, 6])] {
            e.push(Entry {
                name: format!("base_model.model.model.layers.0.self_attn.q_proj.lora_{ab}.weight"),
                dtype: Dtype::BF16,
                data: bf16_bytes(shape.iter().product()),
                shape,
            });
        }
    });
    match open_err(tmp.path()) {
        CheckpointError::LoraWithoutBase { tensor, base } => {
            assert_eq!(
                tensor,
                "model.layers.0.self_attn.q_proj.lora_A.speech.weight"
            );
            assert_eq!(base, "model.layers.0.self_attn.q_proj.weight");
        }
        e => panic!("wrong error: {e}"),
    }
}

#[test]
fn unexpected_and_missing_tensors_are_refused() {
    let tmp = copy_layout("model");
    rewrite(&tmp.path().join("model.safetensors"), |e| {
        e.push(Entry {
            name: "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            dtype: Dtype::BF16,
            shape: vec![3],
            data: bf16_bytes(3),
        })
    });
    let err = open_err(tmp.path());
    assert!(
        matches!(&err, CheckpointError::UnexpectedTensor { tensor, .. } if tensor == "model.layers.0.self_attn.rotary_emb.inv_freq"),
        "{err}"
    );

    let tmp = copy_layout("model");
    rewrite(&tmp.path().join("model.safetensors"), |e| {
        e.retain(|t| t.name != "model.norm.weight")
    });
    let err = open_err(tmp.path());
    assert!(
        matches!(&err, CheckpointError::MissingTensor { tensor } if tensor == "model.norm.weight"),
        "{err}"
    );
}

#[test]
fn invalid_lora_config_is_refused() {
    let tmp = copy_layout("model-original");
    edit_config(tmp.path(), |c| c["speech_lora"]["lora_alpha"] = 0.into());
    let err = open_err(tmp.path());
    assert!(
        matches!(&err, CheckpointError::InvalidConfig { key, .. } if key == "speech_lora.lora_alpha"),
        "{err}"
    );
}

/// Rewrites a safetensors file's header text with `edit` and appends `extra` bytes to its data,
/// keeping everything else as stored (the format's own writer would refuse what these tests
/// need to write).
fn edit_raw(path: &Path, edit: impl FnOnce(String) -> String, extra: &[u8]) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header = edit(String::from_utf8(bytes[8..8 + n].to_vec()).unwrap()).into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&bytes[8 + n..]);
    out.extend_from_slice(extra);
    std::fs::write(path, out).unwrap();
}

/// The safetensors rules a reader must enforce, which a lax header breaks without any tensor's
/// own bytes looking wrong: each tensor named once, the tensors' bytes tiling the data section
/// with no overlap and no bytes left over.
#[test]
fn headers_that_break_the_format_are_refused() {
    let file = "model.safetensors";
    let header_of = |dir: &Path| -> serde_json::Map<String, serde_json::Value> {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        serde_json::from_slice(&bytes[8..8 + n]).unwrap()
    };
    let refusal = |dir: &Path| -> String {
        match open_err(dir) {
            CheckpointError::BadHeader { reason, .. } => reason,
            e => panic!("wrong error: {e}"),
        }
    };

    // A tensor pointed at another's bytes: the final norm reads the first bytes of the file.
    let tmp = copy_layout("model");
    let mut header = header_of(tmp.path());
    let norm = "model.norm.weight";
    let [begin, end] = [0, 1].map(|i| header[norm]["data_offsets"][i].as_u64().unwrap());
    header[norm]["data_offsets"] = serde_json::json!([0, end - begin]);
    edit_raw(
        &tmp.path().join(file),
        |_| serde_json::to_string(&header).unwrap(),
        &[],
    );
    let reason = refusal(tmp.path());
    assert!(reason.contains("overlaps the tensor before it"), "{reason}");

    // A key written twice: which tensor is meant is unclear.
    let tmp = copy_layout("model");
    edit_raw(
        &tmp.path().join(file),
        |text| {
            let entry = serde_json::to_string(&header_of(tmp.path())[norm]).unwrap();
            format!("{{\"{norm}\":{entry},{}", &text[1..])
        },
        &[],
    );
    let reason = refusal(tmp.path());
    assert!(
        reason.contains(&format!("tensor `{norm}` is listed twice")),
        "{reason}"
    );

    // Bytes after the last tensor that belong to none.
    let tmp = copy_layout("model");
    edit_raw(&tmp.path().join(file), |text| text, &[0u8; 4096]);
    let reason = refusal(tmp.path());
    assert!(reason.contains("the rest belongs to no tensor"), "{reason}");
}

/// Config values this implementation would compute wrongly or into NaN are refused by key: an
/// activation it does not compute (it would compute its own instead), and numbers the math
/// needs positive.
#[test]
fn config_values_the_math_cannot_take_are_refused() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 6] = [
        ("vision_config.hidden_act", |c| {
            c["vision_config"]["hidden_act"] = "relu".into()
        }),
        ("audio_config.activation", |c| {
            c["audio_config"]["activation"] = "gelu".into()
        }),
        ("audio_config.nemo_activation", |c| {
            c["audio_config"]["nemo_activation"] = "swish".into()
        }),
        ("rope_theta", |c| {
            c["rope_theta"] = (-1.0).into();
            c["rope_parameters"]["rope_theta"] = (-1.0).into();
        }),
        ("attention_factor", |c| {
            c["rope_parameters"]["attention_factor"] = (-1e30).into();
        }),
        ("vision_config.layer_norm_eps", |c| {
            c["vision_config"]["layer_norm_eps"] = (-1.0).into()
        }),
    ];
    for (key, edit) in cases {
        let tmp = copy_layout("model");
        edit_config(tmp.path(), edit);
        let err = open_err(tmp.path());
        assert!(
            matches!(&err, CheckpointError::InvalidConfig { key: k, .. } if k.ends_with(key)),
            "{key}: {err}"
        );
    }
}
