#!/usr/bin/env python3
"""Golden logits for serving LoRA adapters unmerged (pagoda-model's `LoraWeights`, the engine's
per-request adapters, the server's `base:adapter` names).

Part `llama`: loads tests/golden/tiny-llama (a random LlamaForCausalLM, hidden 64, 4 heads /
2 KV heads, head_dim 16) with transformers, wraps it with two PEFT LoRA adapters whose B
matrices are randomised (PEFT initialises them to zero), saves them with `save_pretrained`, and
records the logits transformers+peft give for a fixed token sequence with no adapter and with
each adapter:

  alpha  r=4, lora_alpha=8, every linear (q/k/v/o/gate/up/down): K and Q both adapted, so a
         Llama GGUF base (Q/K rows permuted by llama.cpp's converter) must permute B's rows
  beta   r=8, lora_alpha=16, use_rslora, q_proj/v_proj only

Part `qwen3moe`: the same on tests/golden/tiny-qwen3moe (Qwen3-MoE: 3 layers, each a sparse
MoE of 8 experts, top-2; made by scripts/reference/golden_families.py), for the adapters Pagoda
serves on a mixture-of-experts model (logits for the token sequence of tiny-qwen3moe/logits.json,
greedy continuations of its greedy_prompts), and one that it refuses:

  attn     r=4, lora_alpha=6, q/k/v/o_proj
  router   r=2, lora_alpha=3, target_modules ["gate"]: transformers 5's router is not an
           nn.Linear, so peft adapts its weight as a parameter (`target_parameters`
           ["gate.weight"]) and saves an ordinary `mlp.gate.lora_A` / `lora_B` pair
  experts  r=1, lora_alpha=2, target_modules q_proj/gate_proj/up_proj/down_proj (no logits):
           with transformers 5 the experts are fused 3-D parameters, and peft turns the expert
           targets into `target_parameters` (gate_up_proj, down_proj) and saves
           `mlp.experts.lora_A` / `mlp.experts.base_layer.lora_A` pairs of rank r x n_experts

Both served adapters change the router's logits, so routing is checked to stay decisive under
each (the smallest gap between the k-th and (k+1)-th router logit, over every token of the
sequences and every layer, above golden_families.py's ROUTER_MIN_GAP; else the B seed is
bumped), so float noise between engines cannot flip an expert choice.

Run: /root/.venvs/pagoda-ref/bin/python scripts/golden_lora_logits.py [llama] [qwen3moe]
     (no argument: both; peft 0.21.2 in the reference venv, see scripts/reference/setup.sh)
Out: tests/golden/tiny-llama-lora/{alpha,beta}/ (adapter_config.json, adapter_model.safetensors)
     and tests/golden/tiny-llama-lora/logits.json ({"token_ids", "base", "alpha", "beta"}: [n, vocab])
     tests/golden/tiny-qwen3moe-lora/{attn,router,experts}/ and
     tests/golden/tiny-qwen3moe-lora/logits.json ({"token_ids", "base", "attn", "router"}:
     [n, vocab], "greedy_prompts", "greedy" {"base", "attn", "router"}, "router_min_topk_gap"
     and "max_abs_diff_vs_base" {"attn", "router"})
"""
import copy
import json
import os
import sys
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

MOE_BASE = ROOT / "tests" / "golden" / "tiny-qwen3moe"
MOE_OUT = ROOT / "tests" / "golden" / "tiny-qwen3moe-lora"
MOE_ADAPTERS = {
    "attn": dict(r=4, lora_alpha=6, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], seed=21),
    "experts": dict(r=1, lora_alpha=2, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"], seed=22),
    "router": dict(r=2, lora_alpha=3, target_modules=["gate"], seed=23),
}
MOE_REFUSED = ("experts",)


def logits(model, tokens=TOKENS):
    with torch.no_grad():
        out = model(torch.tensor([tokens])).logits[0]
    return [[round(float(v), 7) for v in row] for row in out]


def with_adapter(base, spec, seed, scale=0.2, seed_a=True):
    """`base` (copied) wrapped with a LoRA of `spec`: A as peft initialises it (Kaiming
    uniform), then B N(0, scale²) (peft's B is zero), both drawn in turn from one generator
    seeded with `seed`. With `seed_a=False` (how the llama part's adapters were made) only B
    is seeded and A comes from the global generator as loading left it: reproducible for
    `beta` (after `alpha`'s seeded B), not for `alpha` (its A differs from run to run), so a
    rerun of that part rewrites alpha's files and logits."""
    if seed_a:
        torch.manual_seed(seed)
    m = get_peft_model(copy.deepcopy(base), LoraConfig(lora_dropout=0.0, **spec))
    if not seed_a:
        torch.manual_seed(seed)
    with torch.no_grad():
        for pname, p in m.named_parameters():
            if "lora_B" in pname:
                p.copy_(torch.randn_like(p) * scale)
    return m.eval()


def save(m, folder: Path, base_name: str):
    m.peft_config["default"].base_model_name_or_path = base_name
    m.save_pretrained(folder)
    readme = folder / "README.md"
    if readme.exists():
        os.remove(readme)


def llama():
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
        m = with_adapter(base, spec, seed, seed_a=False)
        save(m, OUT / name, "tests/golden/tiny-llama")
        result[name] = logits(m)
    (OUT / "logits.json").write_text(json.dumps(result, separators=(",", ":")))


def qwen3moe():
    sys.path.insert(0, str(ROOT / "scripts" / "reference"))
    from golden_families import ROUTER_MIN_GAP, greedy_of, router_gaps

    golden = json.loads((MOE_BASE / "logits.json").read_text())
    tokens, prompts = golden["token_ids"], golden["greedy_prompts"]
    base = AutoModelForCausalLM.from_pretrained(MOE_BASE, dtype=torch.float32, attn_implementation="eager").eval()
    base_logits = logits(base, tokens)
    base_greedy = greedy_of(base, prompts)
    assert base_greedy == golden["greedy"], "the base no longer gives tiny-qwen3moe's greedy goldens"
    result = {
        "source": f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}, float32, eager",
        "base_model": "tests/golden/tiny-qwen3moe",
        "token_ids": tokens,
        "base": base_logits,
        "greedy_prompts": prompts,
        "greedy": {"base": base_greedy},
        "router_min_topk_gap": {},
        "max_abs_diff_vs_base": {},
    }
    MOE_OUT.mkdir(parents=True, exist_ok=True)
    for name, spec in MOE_ADAPTERS.items():
        spec = dict(spec)
        seed = spec.pop("seed")
        if name in MOE_REFUSED:
            # Refused by Pagoda: only the files matter.
            save(with_adapter(base, spec, seed), MOE_OUT / name, "tests/golden/tiny-qwen3moe")
            continue
        for attempt in range(20):
            m = with_adapter(base, spec, seed + 1000 * attempt)
            injected = m.base_model.model  # the Qwen3MoeForCausalLM with LoRA layers in it
            greedy = greedy_of(injected, prompts)
            gap, _ = router_gaps(injected, [tokens] + [p + g for p, g in zip(prompts, greedy)])
            print(f"{name}: seed {seed + 1000 * attempt}: min router top-k gap {gap:.2e}")
            if gap > ROUTER_MIN_GAP:
                break
        else:
            raise SystemExit("no seed gives decisive routing under the adapter")
        save(m, MOE_OUT / name, "tests/golden/tiny-qwen3moe")
        result[name] = logits(m, tokens)
        result["greedy"][name] = greedy
        result["router_min_topk_gap"][name] = gap
        result["max_abs_diff_vs_base"][name] = max(
            abs(a - b) for ra, rb in zip(result[name], base_logits) for a, b in zip(ra, rb)
        )
    (MOE_OUT / "logits.json").write_text(json.dumps(result, separators=(",", ":")))
    print(f"wrote {MOE_OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    parts = sys.argv[1:] or ["llama", "qwen3moe"]
    for part in parts:
        {"llama": llama, "qwen3moe": qwen3moe}[part]()
