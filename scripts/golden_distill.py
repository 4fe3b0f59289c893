#!/usr/bin/env python3
"""Golden files for pagoda-train (crates/pagoda-train): one distillation step in PyTorch.

The committed tiny random models tests/golden/tiny-llama (Llama, Llama 3 RoPE scaling, separate
head) and tests/golden/tiny-qwen2 (Qwen2: Q/K/V biases, tied head) are loaded with transformers
in float64. A fixed batch of two rows of token ids (the second right-padded), fake teacher
top-k ids and log-probabilities (log_softmax of random logits at the case's temperature, top-k)
and the masks are made with a fixed seed. For each case the loss of crates/pagoda-train/src/
loss.rs is computed with torch autograd:

    p      = teacher top-k renormalised          log q = log_softmax(z / T) over the vocab
    q~     = student renormalised over the top-k
    forward KL  T^2 sum p (log p - log q)
    reverse KL  T^2 sum q~ (log q~ - log p)
    skew KL     T^2 sum p (log p - log(a p + (1 - a) q~))
    CE          -log_softmax(z)[next token]
    loss        = lam * mean_ce(CE) + (1 - lam) * mean_kd(KD)

and the gradients of a few named parameters are saved. A LoRA case (peft's formula written out:
y = x W^T + (alpha / r) (x A^T) B^T, with A and B given explicitly, B non-zero so that A gets a
gradient) saves the gradients of two pairs. Finally one torch.optim.AdamW step, then a second,
with the forward-KL case's gradients (decay on matrices only, as pagoda-train) is saved for a
matrix and a norm weight.

Run: /root/.venvs/pagoda-ref/bin/python scripts/golden_distill.py
Out: tests/golden/distill_step/{cases.json, tensors.safetensors}
"""
import json
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "golden", "distill_step")

TOKENS = [
    [1, 17, 42, 99, 3, 250, 7, 64, 128, 300],
    [2, 8, 19, 77, 140, 200, 31, 0, 0, 0],
]
LENGTHS = [10, 7]
TOP_K = 6

CASES = [
    # name, model, divergence, temperature, hard weight, skew alpha
    ("llama_forward", "tiny-llama", "forward", 2.0, 0.3, 0.1),
    ("llama_reverse", "tiny-llama", "reverse", 1.0, 0.0, 0.1),
    ("llama_skew", "tiny-llama", "skew", 1.5, 0.5, 0.2),
    ("qwen2_forward", "tiny-qwen2", "forward", 1.0, 0.1, 0.1),
]
# Parameters whose gradients are kept (HF names).
GRADS = {
    "tiny-llama": [
        "lm_head.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
    ],
    "tiny-qwen2": [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.bias",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
    ],
}
LORA = {"rank": 4, "alpha": 8.0, "modules": ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]}
ADAM = {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
        "params": ["model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]}


def load(name):
    m = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "tests", "golden", name),
                                             torch_dtype=torch.float64, attn_implementation="eager")
    return m.eval()


def masks():
    kd = torch.zeros(2, 10, dtype=torch.float64)
    ce = torch.zeros(2, 10, dtype=torch.float64)
    nxt = torch.zeros(2, 10, dtype=torch.long)
    for r, n in enumerate(LENGTHS):
        kd[r, :n] = 1
        ce[r, : n - 1] = 1
        nxt[r, : n - 1] = torch.tensor(TOKENS[r][1:n])
    return kd.flatten(), ce.flatten(), nxt.flatten()


def teacher(vocab, temperature, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(20, vocab, generator=g, dtype=torch.float64) * 3.0
    lp = torch.log_softmax(z / temperature, dim=-1)
    vals, ids = lp.topk(TOP_K, dim=-1)
    return ids, vals


def loss_fn(logits, ids, lp, kd_mask, ce_mask, nxt, div, t, lam, alpha):
    log_p = lp - torch.logsumexp(lp, -1, keepdim=True)
    p = log_p.exp()
    if div == "forward":
        log_q = torch.log_softmax(logits / t, -1).gather(-1, ids)
        kd = (p * (log_p - log_q)).sum(-1)
    else:
        z = (logits / t).gather(-1, ids)
        log_qt = z - torch.logsumexp(z, -1, keepdim=True)
        if div == "reverse":
            kd = (log_qt.exp() * (log_qt - log_p)).sum(-1)
        else:
            m = alpha * p + (1 - alpha) * log_qt.exp()
            kd = (p * (log_p - m.log())).sum(-1)
    kd = kd * t * t
    ce = -torch.log_softmax(logits, -1).gather(-1, nxt[:, None])[:, 0]
    return lam * (ce * ce_mask).sum() / ce_mask.sum() + (1 - lam) * (kd * kd_mask).sum() / kd_mask.sum()


def main():
    os.makedirs(OUT, exist_ok=True)
    kd_mask, ce_mask, nxt = masks()
    ids_in = torch.tensor(TOKENS)
    attn = torch.tensor([[1] * n + [0] * (10 - n) for n in LENGTHS])
    tensors = {}
    meta = {"tokens": TOKENS, "lengths": LENGTHS, "top_k": TOP_K, "cases": [], "lora": LORA,
            "adam": ADAM}
    fwd_grads = None
    for i, (name, model_name, div, t, lam, alpha) in enumerate(CASES):
        model = load(model_name)
        vocab = model.config.vocab_size
        top_ids, top_lp = teacher(vocab, t, 100 + i)
        model.zero_grad()
        logits = model(input_ids=ids_in, attention_mask=attn).logits.reshape(20, vocab)
        loss = loss_fn(logits, top_ids, top_lp, kd_mask, ce_mask, nxt, div, t, lam, alpha)
        loss.backward()
        params = dict(model.named_parameters())
        for p in GRADS[model_name]:
            tensors[f"{name}/{p}"] = params[p].grad.float().contiguous()
        if name == "llama_forward":
            fwd_grads = {p: params[p].grad.clone() for p in ADAM["params"]}
            fwd_params = {p: params[p].detach().clone() for p in ADAM["params"]}
        meta["cases"].append({"name": name, "model": model_name, "divergence": div,
                              "temperature": t, "hard_weight": lam, "skew_alpha": alpha,
                              "top_ids": top_ids.tolist(), "top_logprobs": top_lp.tolist(),
                              "loss": loss.item(), "grads": GRADS[model_name]})

    # LoRA: forward KL on tiny-llama, explicit A and B on two linears.
    model = load("tiny-llama")
    for p in model.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(7)
    scaling = LORA["alpha"] / LORA["rank"]
    pairs = {}
    for mod_name in LORA["modules"]:
        mod = model.get_submodule(mod_name)
        a = (torch.rand(LORA["rank"], mod.in_features, generator=g, dtype=torch.float64) * 2 - 1) / mod.in_features ** 0.5
        b = torch.randn(mod.out_features, LORA["rank"], generator=g, dtype=torch.float64) * 0.05
        a.requires_grad_(True)
        b.requires_grad_(True)
        pairs[mod_name] = (a, b)
        tensors[f"lora_init/{mod_name}.lora_A.weight"] = a.detach().float().contiguous()
        tensors[f"lora_init/{mod_name}.lora_B.weight"] = b.detach().float().contiguous()

        def hook(module, inputs, output, a=a, b=b):
            x = inputs[0]
            return output + scaling * (x @ a.T) @ b.T
        mod.register_forward_hook(hook)
    top_ids, top_lp = teacher(model.config.vocab_size, 1.0, 200)
    logits = model(input_ids=ids_in, attention_mask=attn).logits.reshape(20, -1)
    loss = loss_fn(logits, top_ids, top_lp, kd_mask, ce_mask, nxt, "forward", 1.0, 0.0, 0.1)
    loss.backward()
    for mod_name, (a, b) in pairs.items():
        tensors[f"lora/{mod_name}.lora_A.weight"] = a.grad.float().contiguous()
        tensors[f"lora/{mod_name}.lora_B.weight"] = b.grad.float().contiguous()
    meta["lora"].update({"loss": loss.item(), "top_ids": top_ids.tolist(),
                         "top_logprobs": top_lp.tolist(), "temperature": 1.0})

    # AdamW: two steps with the forward case's gradients; decay on matrices only.
    ps = {n: torch.nn.Parameter(fwd_params[n].clone()) for n in ADAM["params"]}
    groups = [{"params": [ps[n]], "weight_decay": ADAM["weight_decay"] if ps[n].dim() >= 2 else 0.0}
              for n in ADAM["params"]]
    opt = torch.optim.AdamW(groups, lr=ADAM["lr"], betas=tuple(ADAM["betas"]), eps=ADAM["eps"])
    for step in (1, 2):
        for n in ADAM["params"]:
            ps[n].grad = fwd_grads[n].clone() * step  # a different gradient at step 2
        opt.step()
        for n in ADAM["params"]:
            tensors[f"adam_step{step}/{n}"] = ps[n].detach().float().contiguous()

    save_file(tensors, os.path.join(OUT, "tensors.safetensors"))
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(meta, f)
    print("wrote", OUT, sum(t.numel() for t in tensors.values()) * 4, "bytes of tensors")


if __name__ == "__main__":
    main()
