#!/usr/bin/env python3
"""Random-weight GGUFs of real model shapes for speed benchmarks against llama.cpp (issue 38:
Llama-3.1-8B and Qwen3-8B), written by gguf-py (the vendored llama.cpp's) and quantized to
Q4_K_M by llama.cpp's own quantizer (llama_model_quantize), so both engines read one file.

The tokenizer is the real one, copied from the sdist's tokenizer-only files
(models/ggml-vocab-llama-bpe.gguf for Llama 3, ggml-vocab-qwen2.gguf for Qwen3), so
`pagoda bench model` and llama.cpp tokenize the benchmark prompt as with the real model.
Weights: N(0, 1/fan_in) (norms 1), so activations stay in range; speed does not depend on
values. `--layers` cuts the depth (every layer has the real shape; the benchmark's per-token
work is then the cut model's, which the record must say).

    PY=/root/.venvs/pagoda-ref/bin/python
    $PY scripts/reference/make_bench_models.py llama31-8b --layers 8 -o /root/models/bench
    $PY scripts/reference/make_bench_models.py qwen3-8b --layers 8 -o /root/models/bench
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SDIST = Path(os.environ.get("PAGODA_LLAMA_SDIST",
                            "/work/cache/sdist/llama_cpp_python-0.3.36")) / "vendor" / "llama.cpp"
sys.path.insert(0, str(SDIST / "gguf-py"))

import numpy as np  # noqa: E402
import gguf  # noqa: E402

SHAPES = {
    # meta-llama/Llama-3.1-8B-Instruct config.json
    "llama31-8b": dict(arch="llama", vocab="llama-bpe", layers=32, hidden=4096, heads=32,
                       kv_heads=8, head_dim=128, ffn=14336, theta=500000.0, eps=1e-5,
                       ctx=131072, qk_norm=False, llama3_rope=True),
    # Qwen/Qwen3-8B config.json
    "qwen3-8b": dict(arch="qwen3", vocab="qwen2", layers=36, hidden=4096, heads=32, kv_heads=8,
                     head_dim=128, ffn=12288, theta=1000000.0, eps=1e-6, ctx=40960,
                     qk_norm=True, llama3_rope=False),
}


def copy_vocab(w: gguf.GGUFWriter, vocab_file: Path) -> int:
    r = gguf.GGUFReader(str(vocab_file))
    n_vocab = 0
    for field in r.fields.values():
        name = field.name
        if not name.startswith("tokenizer."):
            continue
        t = field.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape")
                        for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(name, vals)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            v = field.parts[field.data[0]].tolist()[0]
            {gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.INT32: w.add_int32,
             gguf.GGUFValueType.BOOL: w.add_bool, gguf.GGUFValueType.FLOAT32: w.add_float32,
             gguf.GGUFValueType.UINT64: w.add_uint64}[t](name, v)
    return n_vocab


def llama3_factors(head_dim: int, theta: float) -> np.ndarray:
    """Llama 3.1's rope_freqs (factor 8, low 1, high 4, original 8192), as the converter writes."""
    factor, low, high, old = 8.0, 1.0, 4.0, 8192
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="cut the depth to this many layers")
    ap.add_argument("-o", "--out-dir", default="/root/models/bench")
    args = ap.parse_args()
    s = SHAPES[args.shape]
    n_layers = args.layers or s["layers"]
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{args.shape}-{n_layers}l"
    f16 = out_dir / f"{stem}-f16.gguf"
    q4 = out_dir / f"{stem}-q4_k_m.gguf"
    rng = np.random.default_rng(0)

    w = gguf.GGUFWriter(str(f16), s["arch"])
    w.add_name(stem)
    n_vocab = copy_vocab(w, SDIST / "models" / f"ggml-vocab-{s['vocab']}.gguf")
    d, hd = s["hidden"], s["head_dim"]
    w.add_block_count(n_layers)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", mat(n_vocab, d))
    w.add_tensor("output_norm.weight", ones(d))
    w.add_tensor("output.weight", mat(n_vocab, d))
    if s["llama3_rope"]:
        w.add_tensor("rope_freqs.weight", llama3_factors(hd, s["theta"]))
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    for i in range(n_layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(d))
        w.add_tensor(b + "attn_q.weight", mat(q, d))
        w.add_tensor(b + "attn_k.weight", mat(kv, d))
        w.add_tensor(b + "attn_v.weight", mat(kv, d))
        w.add_tensor(b + "attn_output.weight", mat(d, q))
        if s["qk_norm"]:
            w.add_tensor(b + "attn_q_norm.weight", ones(hd))
            w.add_tensor(b + "attn_k_norm.weight", ones(hd))
        w.add_tensor(b + "ffn_norm.weight", ones(d))
        w.add_tensor(b + "ffn_gate.weight", mat(s["ffn"], d))
        w.add_tensor(b + "ffn_up.weight", mat(s["ffn"], d))
        w.add_tensor(b + "ffn_down.weight", mat(d, s["ffn"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()
    print(f"wrote {f16} ({f16.stat().st_size / 1e9:.2f} GB)", file=sys.stderr)

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(q4).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed: {rc}")
    f16.unlink()
    print(f"wrote {q4} ({q4.stat().st_size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
