#!/usr/bin/env python3
"""Golden files for pagoda-model's LoRA merge (crates/pagoda-model/src/lora.rs).

Builds a tiny random LlamaForCausalLM, wraps it with a PEFT LoRA adapter (r=4, alpha=8, on
q_proj/v_proj/down_proj), randomises the B matrices (PEFT initialises them to zero), saves the
adapter with `save_pretrained`, and writes the targeted modules' base weights and the weights
after `merge_and_unload()` as safetensors (`<module path>.weight`, F32). A second adapter with
the same tensors and `use_rslora=True` gets its own merged weights.

Second part, for `pagoda merge-lora` (crates/pagoda-compress/src/merge/): the committed tiny
random Llama folder tests/golden/tiny-llama (F32 safetensors, config.json, tokenizer) is loaded
with transformers, wrapped with a LoRA adapter on all seven linears of both layers (r=4,
alpha=8, random B), and the logits of a fixed token sequence are saved for the base model, the
base + adapter (unmerged PeftModel) and `merge_and_unload()`. The file also carries the Llama 3
RoPE frequency factors of the base's `rope_scaling`, computed as llama.cpp's
convert_hf_to_gguf.py computes its `rope_freqs` tensor, so that the Rust test can build a GGUF
of the same base (Q/K permuted as llama.cpp permutes them) and check the merge through it.

Run: /root/.venvs/pagoda-gptq/bin/python scripts/golden_lora.py
Out: crates/pagoda-model/tests/golden/lora/{adapter,adapter_rslora}/, base.safetensors,
     merged.safetensors, merged_rslora.safetensors
     crates/pagoda-compress/tests/golden/lora-tiny-llama/adapter/, reference.safetensors
     (logits_base, logits_peft, logits_merged [n, vocab], rope_freqs), reference.json
"""
import json
import math
import copy
import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TINY_LLAMA = os.path.join(ROOT, "tests", "golden", "tiny-llama")
MERGE_OUT = os.path.join(ROOT, "crates", "pagoda-compress", "tests", "golden", "lora-tiny-llama")
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "pagoda-model", "tests", "golden", "lora")
TARGETS = ["q_proj", "v_proj", "down_proj"]


def tiny_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).float().eval()


def targeted(model):
    return {
        f"{name}.weight": mod.weight.detach().clone().contiguous()
        for name, mod in model.named_modules()
        if name.split(".")[-1] in TARGETS and hasattr(mod, "weight")
    }


def adapter(base, use_rslora, b_seed):
    peft_model = get_peft_model(
        copy.deepcopy(base),
        LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, use_rslora=use_rslora),
    )
    torch.manual_seed(b_seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    return peft_model


def main():
    os.makedirs(OUT, exist_ok=True)
    base = tiny_model()
    save_file(targeted(base), os.path.join(OUT, "base.safetensors"))
    for suffix, rslora in (("", False), ("_rslora", True)):
        m = adapter(base, rslora, b_seed=1)
        m.save_pretrained(os.path.join(OUT, "adapter" + suffix))
        os.remove(os.path.join(OUT, "adapter" + suffix, "README.md"))
        merged = m.merge_and_unload()
        save_file(targeted(merged), os.path.join(OUT, f"merged{suffix}.safetensors"))


def llama3_rope_freqs(cfg):
    """llama.cpp convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors): rope_freqs."""
    rs = cfg["rope_scaling"]
    base = cfg.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rs.get("factor", 8.0)
    low_freq_factor = rs.get("low_freq_factor", 1.0)
    high_freq_factor = rs.get("high_freq_factor", 4.0)
    old_context_len = rs.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(rope_factors, dtype=torch.float32)


def merge_reference():
    """Logits of the tiny Llama folder: base, base + adapter, merged (see the module doc)."""
    os.makedirs(MERGE_OUT, exist_ok=True)
    cfg = json.load(open(os.path.join(TINY_LLAMA, "config.json")))
    token_ids = json.load(open(os.path.join(TINY_LLAMA, "logits.json")))["token_ids"]
    base = LlamaForCausalLM.from_pretrained(
        TINY_LLAMA, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits_base = base(ids).logits[0].contiguous()
    peft_model = get_peft_model(
        copy.deepcopy(base),
        LoraConfig(r=4, lora_alpha=8, target_modules=ALL_LINEARS, lora_dropout=0.0),
    )
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    peft_model.eval()
    adapter_dir = os.path.join(MERGE_OUT, "adapter")
    peft_model.save_pretrained(adapter_dir)
    os.remove(os.path.join(adapter_dir, "README.md"))
    with torch.no_grad():
        logits_peft = peft_model(ids).logits[0].contiguous()
        merged = peft_model.merge_and_unload()
        logits_merged = merged(ids).logits[0].contiguous()
    save_file(
        {
            "logits_base": logits_base,
            "logits_peft": logits_peft,
            "logits_merged": logits_merged,
            "rope_freqs": llama3_rope_freqs(cfg),
        },
        os.path.join(MERGE_OUT, "reference.safetensors"),
    )
    with open(os.path.join(MERGE_OUT, "reference.json"), "w") as f:
        json.dump(
            {
                "base": "tests/golden/tiny-llama",
                "reference": "transformers + peft merge_and_unload",
                "token_ids": token_ids,
                "max_abs_diff_peft_vs_merged": float((logits_peft - logits_merged).abs().max()),
                "max_abs_diff_base_vs_merged": float((logits_base - logits_merged).abs().max()),
            },
            f,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
    merge_reference()
