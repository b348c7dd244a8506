"""The Python reference side of scripts/bench-vs-transformers.sh for the text decoder.

A transformers `Phi3ForCausalLM` with the benchmark config, loaded in f32 from the same bf16
checkpoint switchyard reads (`phi4mm bench-checkpoint`), and peft with both LoRA adapters
(`adapter_names` per row for the mixed batch). The same prompt and step counts as
`phi4mm bench` / `phi4mm bench-batch`. Prints one JSON line.

    python decoder.py CHECKPOINT_DIR --threads N [--rounds 5]
"""

import argparse
import json
import os
import statistics
import time

import torch
from safetensors.torch import load_file
from transformers import Phi3Config, Phi3ForCausalLM


def prompt_ids(n):
    # The same deterministic prompt as `phi4mm bench` / `bench-batch`.
    return [(i * 7919 + 13) % 199_000 for i in range(n)]


def text_config(ckpt):
    c = json.load(open(os.path.join(ckpt, "config.json")))
    rope = dict(c["rope_parameters"])
    return Phi3Config(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"],
        num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"],
        max_position_embeddings=c["max_position_embeddings"],
        original_max_position_embeddings=c["original_max_position_embeddings"],
        rms_norm_eps=c["rms_norm_eps"],
        rope_parameters=rope,
        partial_rotary_factor=c["partial_rotary_factor"],
        tie_word_embeddings=c["tie_word_embeddings"],
        bos_token_id=c["bos_token_id"],
        pad_token_id=c["pad_token_id"],
        eos_token_id=c["eos_token_id"],
    )


def load_model(ckpt):
    model = Phi3ForCausalLM(text_config(ckpt)).eval()
    sd = load_file(os.path.join(ckpt, "model.safetensors"))
    text = {k: v.float() for k, v in sd.items() if k.startswith("model.layers.") or k in ("model.embed_tokens.weight", "model.norm.weight")}
    missing, unexpected = model.load_state_dict(text, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]  # tied
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    return model


def with_adapters(model, ckpt):
    from peft import LoraConfig, get_peft_model

    targets = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    peft_model = None
    for name in ("speech", "vision"):
        folder = os.path.join(ckpt, f"{name}-lora")
        ac = json.load(open(os.path.join(folder, "adapter_config.json")))
        cfg = LoraConfig(r=ac["r"], lora_alpha=ac["lora_alpha"], target_modules=targets, lora_dropout=0.0)
        if peft_model is None:
            peft_model = get_peft_model(model, cfg, adapter_name=name)
        else:
            peft_model.add_adapter(name, cfg)
        weights = load_file(os.path.join(folder, "adapter_model.safetensors"))
        sd = {}
        for k, v in weights.items():
            # base_model.model.model.layers.N.<module>.lora_A.weight -> ...lora_A.<name>.weight
            stem, ab, _ = k.rsplit(".", 2)
            sd[f"{stem}.{ab}.{name}.weight"] = v.float()
        missing, unexpected = peft_model.load_state_dict(sd, strict=False)
        assert not unexpected, unexpected
    return peft_model.eval()


@torch.inference_mode()
def prefill(model, ids, **kw):
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **kw)
    return out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)


@torch.inference_mode()
def decode(model, past, nxt, steps, **kw):
    t = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=nxt, past_key_values=past, use_cache=True, **kw)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--batch-steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(a.checkpoint)
    ids1 = torch.tensor([prompt_ids(a.prompt_tokens)])
    ids8 = ids1.repeat(8, 1)

    ttft, b1 = [], []
    for _ in range(a.rounds):
        t = time.perf_counter()
        past, nxt = prefill(model, ids1)
        ttft.append(time.perf_counter() - t)
        b1.append((a.new_tokens - 1) / decode(model, past, nxt, a.new_tokens - 1))

    peft_model = with_adapters(model, a.checkpoint)
    # 3 base, 3 speech r32, 2 vision r24: the order of `phi4mm bench-batch`.
    mixed = ["__base__", "speech", "vision", "__base__", "speech", "vision", "__base__", "speech"]
    b8, b8m, extra = [], [], []
    for _ in range(a.rounds):
        # Base-only with the adapters switched off (peft's cheapest base path), then the mixed
        # batch, alternating in every round.
        with peft_model.disable_adapter():
            past, nxt = prefill(peft_model, ids8)
            s_base = decode(peft_model, past, nxt, a.batch_steps)
        past, nxt = prefill(peft_model, ids8, adapter_names=mixed)
        s_mixed = decode(peft_model, past, nxt, a.batch_steps, adapter_names=mixed)
        b8.append(8 * a.batch_steps / s_base)
        b8m.append(8 * a.batch_steps / s_mixed)
        extra.append(s_mixed / s_base - 1.0)
    print(json.dumps({
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "peft": __import__("peft").__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "prefill_tokens_per_s": a.prompt_tokens / min(ttft),
        "decode_tokens_per_s_batch1": max(b1),
        "decode_tokens_per_s_batch8": max(b8),
        "decode_tokens_per_s_batch8_mixed_adapters": max(b8m),
        "mixed_extra_time_median": statistics.median(extra),
        "mixed_extra_time_rounds": extra,
        "rounds": a.rounds,
    }))


if __name__ == "__main__":
    main()
