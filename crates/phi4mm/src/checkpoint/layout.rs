//! Tensor names of both layouts mapped onto one canonical form: the transformers-native names for
//! base weights, and `model.layers.{i}.<m>.lora_{A,B}.<adapter>.weight` for LoRA tensors (the
//! original layout's inline form, which carries the adapter in the name).

/// The decoder modules both adapters target.
pub const LORA_TARGETS: [&str; 4] = [
    "self_attn.qkv_proj",
    "self_attn.o_proj",
    "mlp.gate_up_proj",
    "mlp.down_proj",
];

/// One of the checkpoint's two LoRA adapters: what a LoRA tensor belongs to, and where the
/// transformers layout keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoraAdapter {
    Speech,
    Vision,
}

impl LoraAdapter {
    pub const ALL: [LoraAdapter; 2] = [LoraAdapter::Speech, LoraAdapter::Vision];

    /// The adapter's segment in canonical tensor names.
    pub fn as_str(self) -> &'static str {
        match self {
            LoraAdapter::Speech => "speech",
            LoraAdapter::Vision => "vision",
        }
    }

    pub fn folder(self) -> &'static str {
        match self {
            LoraAdapter::Speech => "speech-lora",
            LoraAdapter::Vision => "vision-lora",
        }
    }
}

/// Canonical name of a LoRA tensor.
pub fn lora_name(layer: usize, module: &str, ab: char, adapter: LoraAdapter) -> String {
    format!(
        "model.layers.{layer}.{module}.lora_{ab}.{}.weight",
        adapter.as_str()
    )
}

/// Original remote-code name → canonical name (the rules of transformers' converter).
pub fn canonical_from_original(name: &str) -> String {
    let mut n = name.replace(".base_layer.weight", ".weight");
    const RULES: [(&str, &str); 13] = [
        (".net.0.linear.", ".gate_up_proj."),
        (".net.2.", ".down_proj."),
        (".self_attn.linear_q.", ".self_attn.q_proj."),
        (".self_attn.linear_k.", ".self_attn.k_proj."),
        (".self_attn.linear_v.", ".self_attn.v_proj."),
        (".self_attn.linear_out.", ".self_attn.o_proj."),
        (
            "image_embed.img_projection.0.",
            "image_embed.img_projection_up.",
        ),
        (
            "image_embed.img_projection.2.",
            "image_embed.img_projection_down.",
        ),
        ("audio_projection.speech.0.", "up_proj_for_speech."),
        ("audio_projection.speech.2.", "down_proj_for_speech."),
        ("audio_projection.vision.0.", "up_proj_for_vision_speech."),
        ("audio_projection.vision.2.", "down_proj_for_vision_speech."),
        (
            "image_embed.glb_GN",
            "image_embed.global_img_feature_extensor",
        ),
    ];
    for (from, to) in RULES {
        if n.contains(from) {
            n = n.replace(from, to);
        }
    }
    if n.ends_with("image_embed.sub_GN") {
        n = n.replace("image_embed.sub_GN", "image_embed.sub_img_feature_extensor");
    }
    n
}

/// A key of a PEFT adapter file (either peft's `base_model.model.`-prefixed form or the
/// converter's bare form, with or without an adapter-name segment) → canonical name. `None` when the
/// key is not a `lora_A`/`lora_B` weight.
pub fn canonical_from_adapter_file(key: &str, adapter: LoraAdapter) -> Option<String> {
    let key = key.strip_prefix("base_model.model.").unwrap_or(key);
    let key = key.strip_suffix(".weight")?;
    for ab in ['A', 'B'] {
        let marker = format!(".lora_{ab}");
        if let Some(pos) = key.find(&marker) {
            let rest = &key[pos + marker.len()..];
            // Either nothing follows, or exactly one adapter-name segment.
            if rest.is_empty() || (rest.starts_with('.') && !rest[1..].contains('.')) {
                return Some(format!(
                    "{}.lora_{ab}.{}.weight",
                    &key[..pos],
                    adapter.as_str()
                ));
            }
        }
    }
    None
}

/// Parsed canonical LoRA name: (layer, module, A or B, adapter).
pub fn parse_lora_name(name: &str) -> Option<(Option<usize>, String, char, Option<LoraAdapter>)> {
    let stem = name.strip_suffix(".weight")?;
    let (module_path, rest) = if let Some(p) = stem.find(".lora_A.") {
        (&stem[..p], ('A', &stem[p + 8..]))
    } else if let Some(p) = stem.find(".lora_B.") {
        (&stem[..p], ('B', &stem[p + 8..]))
    } else {
        return None;
    };
    let adapter = match rest.1 {
        "speech" => Some(LoraAdapter::Speech),
        "vision" => Some(LoraAdapter::Vision),
        _ => None,
    };
    let layer = module_path
        .strip_prefix("model.layers.")
        .and_then(|r| r.split('.').next())
        .and_then(|l| l.parse().ok());
    Some((layer, module_path.to_string(), rest.0, adapter))
}
