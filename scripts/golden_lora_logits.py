#!/usr/bin/env python3
"""Golden logits for serving LoRA adapters unmerged (pagoda-model's `LoraWeights`, the engine's
per-request adapters, the server's `base:adapter` names).

Loads tests/golden/tiny-llama (a random LlamaForCausalLM, hidden 64, 4 heads / 2 KV heads,
head_dim 16) with transformers, wraps it with two PEFT LoRA adapters whose B matrices are
randomised (PEFT initialises them to zero), saves them with `save_pretrained`, and records the
logits transformers+peft give for a fixed token sequence with no adapter and with each adapter:

  alpha  r=4, lora_alpha=8, every linear (q/k/v/o/gate/up/down): K and Q both adapted, so a
         Llama GGUF base (Q/K rows permuted by llama.cpp's converter) must permute B's rows
  beta   r=8, lora_alpha=16, use_rslora, q_proj/v_proj only

Run: /root/.venvs/pagoda-gptq/bin/python scripts/golden_lora_logits.py
Out: tests/golden/tiny-llama-lora/{alpha,beta}/ (adapter_config.json, adapter_model.safetensors)
     and tests/golden/tiny-llama-lora/logits.json ({"token_ids", "base", "alpha", "beta"}: [n, vocab])
"""
import copy
import json
import os
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "tests" / "golden" / "tiny-llama"
OUT = ROOT / "tests" / "golden" / "tiny-llama-lora"
TOKENS = [0, 273, 225, 85, 89, 294, 79, 281, 86, 83, 91, 82]

ADAPTERS = {
    "alpha": dict(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        seed=11,
    ),
    "beta": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], use_rslora=True, seed=12),
}


def logits(model):
    with torch.no_grad():
        out = model(torch.tensor([TOKENS])).logits[0]
    return [[round(float(v), 7) for v in row] for row in out]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32, attn_implementation="eager").eval()
    result = {
        "source": f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}, float32, eager",
        "token_ids": TOKENS,
        "base": logits(base),
    }
    for name, spec in ADAPTERS.items():
        spec = dict(spec)
        seed = spec.pop("seed")
        m = get_peft_model(copy.deepcopy(base), LoraConfig(lora_dropout=0.0, **spec))
        torch.manual_seed(seed)
        with torch.no_grad():
            for pname, p in m.named_parameters():
                if "lora_B" in pname:
                    p.copy_(torch.randn_like(p) * 0.2)
        m.eval()
        m.peft_config["default"].base_model_name_or_path = "tests/golden/tiny-llama"
        m.save_pretrained(OUT / name)
        readme = OUT / name / "README.md"
        if readme.exists():
            os.remove(readme)
        result[name] = logits(m)
    (OUT / "logits.json").write_text(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
