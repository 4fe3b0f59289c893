#!/usr/bin/env python3
"""Makes an F16 Hugging Face folder of a Llama GGUF (e.g. SmolLM2), for trying
`pagoda quantize FOLDER -o OUT.gguf` on a real model.

Weights: every tensor of the GGUF dequantized by gguf-py (`gguf.quants.dequantize`), Q/K rows
put back from llama.cpp's interleaved RoPE order into Hugging Face's half-split order,
written as F16 `model.safetensors` under transformers' names. config.json and the tokenizer
files come from `pagoda quantize GGUF -o TMP --format gptq --method rtn` (Pagoda's own GGUF →
folder export), with the quantization_config removed.

    /root/.venvs/pagoda-ref/bin/python scripts/make_hf_f16.py PAGODA_BIN GGUF OUT_DIR
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file

LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    _, layer, sub, kind = name.split(".")
    return f"model.layers.{layer}.{LAYER[sub]}.{kind}"


def unpermute(w, n_head):
    # llama.cpp: w.reshape(n_head, 2, rows/n_head/2, ...).swapaxes(1, 2); undone here.
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    pagoda, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "export"
        subprocess.run([pagoda, "quantize", str(src), "-o", str(export), "--format", "gptq",
                        "--method", "rtn"], check=True)
        out.mkdir(parents=True, exist_ok=True)
        for f in export.iterdir():
            if f.name != "model.safetensors":
                shutil.copy(f, out / f.name)
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    n_head = r.fields[f"{arch}.attention.head_count"].contents()
    n_kv = r.fields[f"{arch}.attention.head_count_kv"].contents()
    tensors = {}
    for t in r.tensors:
        if t.name == "rope_freqs.weight":
            continue
        w = dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        if arch == "llama" and ".attn_q." in t.name:
            w = unpermute(w, n_head)
        elif arch == "llama" and ".attn_k." in t.name:
            w = unpermute(w, n_kv)
        tensors[hf_name(t.name)] = np.ascontiguousarray(w.astype(np.float16))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {out} ({len(tensors)} tensors, F16)")


if __name__ == "__main__":
    main()
