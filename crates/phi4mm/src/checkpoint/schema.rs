//! The exact tensor set a config implies (canonical names and shapes).

use std::collections::BTreeMap;

use super::config::ModelConfig;

/// Whether the model reads a tensor. Unused tensors (the SigLIP pooling head and post-LayerNorm,
/// which the reference loads but never runs) are accepted with checked shapes but not required.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    Required,
    Optional,
}

pub type Schema = BTreeMap<String, (Vec<usize>, Need)>;

pub const VISION_PREFIX: &str = "model.embed_tokens_extend.image_embed.";
pub const AUDIO_PREFIX: &str = "model.embed_tokens_extend.audio_embed.";

/// (in, out) of a LoRA-targeted decoder module.
pub fn module_dims(c: &ModelConfig, module: &str) -> Option<(usize, usize)> {
    let t = &c.text;
    let qkv_out = (t.num_heads + 2 * t.num_kv_heads) * t.head_dim;
    match module {
        "self_attn.qkv_proj" => Some((t.hidden_size, qkv_out)),
        "self_attn.o_proj" => Some((t.num_heads * t.head_dim, t.hidden_size)),
        "mlp.gate_up_proj" => Some((t.hidden_size, 2 * t.intermediate_size)),
        "mlp.down_proj" => Some((t.intermediate_size, t.hidden_size)),
        _ => None,
    }
}

pub fn expected_schema(c: &ModelConfig) -> Schema {
    let mut s = Schema::new();
    let mut req = |name: String, shape: Vec<usize>| {
        s.insert(name, (shape, Need::Required));
    };
    let t = &c.text;
    let h = t.hidden_size;
    req("model.embed_tokens.weight".into(), vec![t.vocab_size, h]);
    req("model.norm.weight".into(), vec![h]);
    for i in 0..t.num_layers {
        let p = format!("model.layers.{i}.");
        req(format!("{p}input_layernorm.weight"), vec![h]);
        req(format!("{p}post_attention_layernorm.weight"), vec![h]);
        for m in super::layout::LORA_TARGETS {
            let (din, dout) = module_dims(c, m).expect("target module");
            req(format!("{p}{m}.weight"), vec![dout, din]);
        }
    }

    // Vision tower (SigLIP-NaViT), separators and projection.
    let v = &c.vision;
    let vp = VISION_PREFIX;
    let vh = v.hidden_size;
    let ip = format!("{vp}img_processor.");
    req(
        format!("{ip}embeddings.patch_embedding.weight"),
        vec![vh, v.num_channels, v.patch_size, v.patch_size],
    );
    req(format!("{ip}embeddings.patch_embedding.bias"), vec![vh]);
    req(
        format!("{ip}embeddings.position_embedding.weight"),
        vec![v.grid() * v.grid(), vh],
    );
    for i in 0..v.num_layers {
        let p = format!("{ip}encoder.layers.{i}.");
        for ln in ["layer_norm1", "layer_norm2"] {
            req(format!("{p}{ln}.weight"), vec![vh]);
            req(format!("{p}{ln}.bias"), vec![vh]);
        }
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            req(format!("{p}self_attn.{proj}.weight"), vec![vh, vh]);
            req(format!("{p}self_attn.{proj}.bias"), vec![vh]);
        }
        req(format!("{p}mlp.fc1.weight"), vec![v.intermediate_size, vh]);
        req(format!("{p}mlp.fc1.bias"), vec![v.intermediate_size]);
        req(format!("{p}mlp.fc2.weight"), vec![vh, v.intermediate_size]);
        req(format!("{p}mlp.fc2.bias"), vec![vh]);
    }
    req(format!("{vp}global_img_feature_extensor"), vec![1, 1, vh]);
    req(format!("{vp}sub_img_feature_extensor"), vec![1, 1, 1, vh]);
    req(format!("{vp}img_projection_up.weight"), vec![h, vh]);
    req(format!("{vp}img_projection_up.bias"), vec![h]);
    req(format!("{vp}img_projection_down.weight"), vec![h, h]);
    req(format!("{vp}img_projection_down.bias"), vec![h]);

    // Audio encoder and both projections.
    let a = &c.audio;
    let ap = AUDIO_PREFIX;
    let ep = format!("{ap}encoder.");
    let ah = a.hidden_size;
    let cc = a.nemo_conv_channels;
    req(
        format!("{ep}encoder_embedding.global_mean"),
        vec![a.input_size],
    );
    req(
        format!("{ep}encoder_embedding.global_invstd"),
        vec![a.input_size],
    );
    req(format!("{ep}embed.conv.0.weight"), vec![cc, 1, 3, 3]);
    req(format!("{ep}embed.conv.0.bias"), vec![cc]);
    for stage in 1..a.subsampling_stages() {
        let dw = 3 * stage - 1;
        req(format!("{ep}embed.conv.{dw}.weight"), vec![cc, 1, 3, 3]);
        req(format!("{ep}embed.conv.{dw}.bias"), vec![cc]);
        req(
            format!("{ep}embed.conv.{}.weight", dw + 1),
            vec![cc, cc, 1, 1],
        );
        req(format!("{ep}embed.conv.{}.bias", dw + 1), vec![cc]);
    }
    req(
        format!("{ep}embed.out.weight"),
        vec![ah, cc * a.subsampled_freq()],
    );
    req(format!("{ep}embed.out.bias"), vec![ah]);
    req(
        format!("{ep}relative_attention_bias_layer.bias_values.weight"),
        vec![2 * a.bias_max_distance, a.num_heads],
    );
    for i in 0..a.num_blocks {
        let p = format!("{ep}encoders.{i}.");
        for ff in ["feed_forward_in", "feed_forward_out"] {
            req(format!("{p}{ff}.layer_norm.weight"), vec![ah]);
            req(format!("{p}{ff}.layer_norm.bias"), vec![ah]);
            req(
                format!("{p}{ff}.gate_up_proj.weight"),
                vec![2 * a.intermediate_size, ah],
            );
            req(
                format!("{p}{ff}.gate_up_proj.bias"),
                vec![2 * a.intermediate_size],
            );
            req(
                format!("{p}{ff}.down_proj.weight"),
                vec![ah, a.intermediate_size],
            );
            req(format!("{p}{ff}.down_proj.bias"), vec![ah]);
        }
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            req(format!("{p}self_attn.{proj}.weight"), vec![ah, ah]);
            req(format!("{p}self_attn.{proj}.bias"), vec![ah]);
        }
        for ln in ["layer_norm_att", "conv.layer_norm", "layer_norm"] {
            req(format!("{p}{ln}.weight"), vec![ah]);
            req(format!("{p}{ln}.bias"), vec![ah]);
        }
        req(
            format!("{p}conv.glu.ext_pw_conv_1d.weight"),
            vec![2 * ah, ah, 1],
        );
        req(format!("{p}conv.glu.ext_pw_conv_1d.bias"), vec![2 * ah]);
        req(format!("{p}conv.glu.b1"), vec![1, ah, 1]);
        req(format!("{p}conv.glu.b2"), vec![1, ah, 1]);
        req(
            format!("{p}conv.dw_sep_conv_1d.dw_conv.weight"),
            vec![ah, 1, a.kernel_size],
        );
        req(format!("{p}conv.dw_sep_conv_1d.dw_conv.bias"), vec![ah]);
        req(
            format!("{p}conv.dw_sep_conv_1d.pw_conv.weight"),
            vec![ah, ah, 1],
        );
        req(format!("{p}conv.dw_sep_conv_1d.pw_conv.bias"), vec![ah]);
        req(format!("{p}conv.ext_pw_conv_1d.weight"), vec![ah, ah, 1]);
        req(format!("{p}conv.ext_pw_conv_1d.bias"), vec![ah]);
    }
    for branch in ["speech", "vision_speech"] {
        req(
            format!("{ap}up_proj_for_{branch}.weight"),
            vec![h, ah * a.downsample_rate],
        );
        req(format!("{ap}up_proj_for_{branch}.bias"), vec![h]);
        req(format!("{ap}down_proj_for_{branch}.weight"), vec![h, h]);
        req(format!("{ap}down_proj_for_{branch}.bias"), vec![h]);
    }

    // Loaded-but-unused SigLIP parts.
    let mut opt = |name: String, shape: Vec<usize>| {
        s.insert(name, (shape, Need::Optional));
    };
    let vi = v.intermediate_size;
    opt(format!("{ip}post_layernorm.weight"), vec![vh]);
    opt(format!("{ip}post_layernorm.bias"), vec![vh]);
    opt(format!("{ip}head.probe"), vec![1, 1, vh]);
    opt(
        format!("{ip}head.attention.in_proj_weight"),
        vec![3 * vh, vh],
    );
    opt(format!("{ip}head.attention.in_proj_bias"), vec![3 * vh]);
    opt(format!("{ip}head.attention.out_proj.weight"), vec![vh, vh]);
    opt(format!("{ip}head.attention.out_proj.bias"), vec![vh]);
    opt(format!("{ip}head.layernorm.weight"), vec![vh]);
    opt(format!("{ip}head.layernorm.bias"), vec![vh]);
    opt(format!("{ip}head.mlp.fc1.weight"), vec![vi, vh]);
    opt(format!("{ip}head.mlp.fc1.bias"), vec![vi]);
    opt(format!("{ip}head.mlp.fc2.weight"), vec![vh, vi]);
    opt(format!("{ip}head.mlp.fc2.bias"), vec![vh]);
    if !t.tie_word_embeddings {
        s.insert(
            "lm_head.weight".into(),
            (vec![t.vocab_size, h], Need::Required),
        );
    }
    s
}
