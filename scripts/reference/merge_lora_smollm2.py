#!/usr/bin/env python3
"""`pagoda merge-lora` on the real SmolLM2-135M (GGUF Q4_1 + Q8_0) against transformers + peft.

The GGUF's tensors are dequantized with gguf-py and loaded into transformers' LlamaForCausalLM
(Q/K rows un-permuted: the inverse of llama.cpp's convert permutation), a random LoRA adapter
(r=8, alpha=16, all seven linears, random B) is made with peft on that model and saved, and the
logits of a fixed token sequence are saved for the base, the PeftModel and merge_and_unload().
Then run Pagoda on the same GGUF and adapter and compare (see docs/lora.md for the figures):

  /root/.venvs/pagoda-gptq/bin/python scripts/reference/merge_lora_smollm2.py GGUF OUT_DIR
  (needs torch, transformers, peft and gguf-py: `pip install gguf` in that venv if missing)
  pagoda merge-lora GGUF OUT_DIR/adapter -o OUT_DIR/merged.gguf --dtype f32
  cargo run -p pagoda-model --example logits -- OUT_DIR/merged.gguf "$(cat OUT_DIR/tokens.json)"

Not a golden (the model is 100 MB): a check run by hand.
"""
import copy
import json
import os
import sys

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
TOKENS = [1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 2365, 314, 7042, 28, 216, 2]


def unpermute(w, n_head):
    """Inverse of llama.cpp's permute: GGUF row (h, i, j) back to HF row (h, j, i)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if v.dtype == np.uint8 else v[0].item()


def main(gguf_path, out):
    os.makedirs(out, exist_ok=True)
    r = GGUFReader(gguf_path)
    n_head = field(r, "llama.attention.head_count")
    n_kv = field(r, "llama.attention.head_count_kv")
    cfg = LlamaConfig(
        hidden_size=field(r, "llama.embedding_length"),
        num_hidden_layers=field(r, "llama.block_count"),
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        intermediate_size=field(r, "llama.feed_forward_length"),
        rms_norm_eps=field(r, "llama.attention.layer_norm_rms_epsilon"),
        rope_theta=field(r, "llama.rope.freq_base"),
        max_position_embeddings=field(r, "llama.context_length"),
        vocab_size=len(r.fields["tokenizer.ggml.tokens"].data),
        tie_word_embeddings="output.weight" not in [t.name for t in r.tensors],
    )
    sd = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        w = np.ascontiguousarray(w, dtype=np.float32)
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        else:
            if parts[2] == "attn_q":
                w = unpermute(w, n_head)
            if parts[2] == "attn_k":
                w = unpermute(w, n_kv)
            name = f"model.layers.{parts[1]}.{LAYER[parts[2]]}.weight"
        sd[name] = torch.from_numpy(w)
    model = LlamaForCausalLM(cfg).float().eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    model.tie_weights()
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        base = model(ids).logits[0]
    peft_model = get_peft_model(
        copy.deepcopy(model),
        LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    )
    torch.manual_seed(3)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.02)
    peft_model.eval()
    peft_model.save_pretrained(os.path.join(out, "adapter"))
    with torch.no_grad():
        peft_logits = peft_model(ids).logits[0]
        merged = peft_model.merge_and_unload()(ids).logits[0]
    json.dump(TOKENS, open(os.path.join(out, "tokens.json"), "w"))
    np.save(os.path.join(out, "tf_base.npy"), base.numpy())
    np.save(os.path.join(out, "tf_peft.npy"), peft_logits.numpy())
    np.save(os.path.join(out, "tf_merged.npy"), merged.numpy())
    print("transformers: max |base - merged|", float((base - merged).abs().max()),
          "max |peft - merged|", float((peft_logits - merged).abs().max()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
