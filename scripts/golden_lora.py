#!/usr/bin/env python3
"""Golden files for pagoda-model's LoRA merge (crates/pagoda-model/src/lora.rs).

Builds a tiny random LlamaForCausalLM, wraps it with a PEFT LoRA adapter (r=4, alpha=8, on
q_proj/v_proj/down_proj), randomises the B matrices (PEFT initialises them to zero), saves the
adapter with `save_pretrained`, and writes the targeted modules' base weights and the weights
after `merge_and_unload()` as safetensors (`<module path>.weight`, F32). A second adapter with
the same tensors and `use_rslora=True` gets its own merged weights.

Run: /root/.venvs/pagoda-gptq/bin/python scripts/golden_lora.py
Out: crates/pagoda-model/tests/golden/lora/{adapter,adapter_rslora}/, base.safetensors,
     merged.safetensors, merged_rslora.safetensors
"""
import copy
import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

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


if __name__ == "__main__":
    main()
