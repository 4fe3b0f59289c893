#!/usr/bin/env python3
"""Random-weight GGUFs of real model shapes for speed benchmarks against llama.cpp (issue 38:
Llama-3.1-8B and Qwen3-8B; issue 39: the mixture-of-experts Qwen3-30B-A3B), written by gguf-py
(the vendored llama.cpp's) and quantized to Q4_K_M by llama.cpp's own quantizer
(llama_model_quantize), so both engines read one file.

The tokenizer is the real one, copied from the sdist's tokenizer-only files
(models/ggml-vocab-llama-bpe.gguf for Llama 3, ggml-vocab-qwen2.gguf for Qwen3), so
`pagoda bench model` and llama.cpp tokenize the benchmark prompt as with the real model.
Weights: N(0, 1/fan_in) (norms 1), so activations stay in range; speed does not depend on
values. `--layers` cuts the depth (every layer has the real shape; the benchmark's per-token
work is then the cut model's, which the record must say).

The MoE shape (llama.cpp arch `qwen3moe`) writes per layer a router `ffn_gate_inp` (F32, as the
converter keeps it and the quantizer leaves it; N(0, 1/fan_in) so tokens route differently) and
the stacked experts `ffn_{gate,up}_exps` [n_embd, n_ff_exp, n_expert] and `ffn_down_exps`
[n_ff_exp, n_embd, n_expert] (ggml order), which llama.cpp quantizes like dense FFN tensors.
Tensors are generated one at a time while writing, so memory stays near one tensor (an expert
stack is 0.4 GB in F16) although the F16 intermediate of the 6-layer MoE cut is 8.7 GB; it is
written next to the output and deleted after quantizing (about 7 minutes on 2 cores; the
Q4_K_M file is 2.65 GB).

    PY=/root/.venvs/pagoda-ref/bin/python
    $PY scripts/reference/make_bench_models.py llama31-8b --layers 8 -o /root/models/bench
    $PY scripts/reference/make_bench_models.py qwen3-8b --layers 8 -o /root/models/bench
    $PY scripts/reference/make_bench_models.py qwen3-30b-a3b --layers 6 -o /root/models/bench
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

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
    # Qwen/Qwen3-30B-A3B config.json: `ffn` is the unused dense intermediate_size, the experts'
    # width is moe_intermediate_size (norm_topk_prob is true; llama.cpp's qwen3moe hardcodes it)
    "qwen3-30b-a3b": dict(arch="qwen3moe", vocab="qwen2", layers=48, hidden=2048, heads=32,
                          kv_heads=4, head_dim=128, ffn=6144, theta=1000000.0, eps=1e-6,
                          ctx=40960, qk_norm=True, llama3_rope=False,
                          moe=dict(experts=128, used=8, ffn_exp=768)),
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
    moe = s.get("moe")
    if moe:
        w.add_expert_count(moe["experts"])
        w.add_expert_used_count(moe["used"])
        w.add_expert_feed_forward_length(moe["ffn_exp"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    # (name, numpy shape (ggml's reversed), dtype, maker): tensors are made while writing, in
    # this order, so memory holds one at a time and the random stream is the declared order's
    plan: list[tuple[str, tuple[int, ...], type, Callable[[], np.ndarray]]] = []

    def mat(name: str, rows: int, cols: int) -> None:
        def make() -> np.ndarray:
            x = rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
            return x.astype(np.float16)
        plan.append((name, (rows, cols), np.float16, make))

    def experts(name: str, n: int, rows: int, cols: int) -> None:
        def make() -> np.ndarray:
            out = np.empty((n, rows, cols), dtype=np.float16)
            for e in range(n):
                out[e] = rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
            return out
        plan.append((name, (n, rows, cols), np.float16, make))

    def router(name: str, n: int, cols: int) -> None:
        def make() -> np.ndarray:
            x = rng.standard_normal((n, cols), dtype=np.float32) / np.sqrt(cols)
            return x.astype(np.float32)  # np.sqrt's float64 scalar promotes the division
        plan.append((name, (n, cols), np.float32, make))

    def ones(name: str, n: int) -> None:
        plan.append((name, (n,), np.float32, lambda: np.ones(n, dtype=np.float32)))

    def fixed(name: str, x: np.ndarray) -> None:
        plan.append((name, x.shape, x.dtype.type, lambda: x))

    mat("token_embd.weight", n_vocab, d)
    ones("output_norm.weight", d)
    mat("output.weight", n_vocab, d)
    if s["llama3_rope"]:
        fixed("rope_freqs.weight", llama3_factors(hd, s["theta"]))
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    for i in range(n_layers):
        b = f"blk.{i}."
        ones(b + "attn_norm.weight", d)
        mat(b + "attn_q.weight", q, d)
        mat(b + "attn_k.weight", kv, d)
        mat(b + "attn_v.weight", kv, d)
        mat(b + "attn_output.weight", d, q)
        if s["qk_norm"]:
            ones(b + "attn_q_norm.weight", hd)
            ones(b + "attn_k_norm.weight", hd)
        ones(b + "ffn_norm.weight", d)
        if moe:
            n_e, f = moe["experts"], moe["ffn_exp"]
            router(b + "ffn_gate_inp.weight", n_e, d)
            experts(b + "ffn_gate_exps.weight", n_e, f, d)
            experts(b + "ffn_up_exps.weight", n_e, f, d)
            experts(b + "ffn_down_exps.weight", n_e, d, f)
        else:
            mat(b + "ffn_gate.weight", s["ffn"], d)
            mat(b + "ffn_up.weight", s["ffn"], d)
            mat(b + "ffn_down.weight", d, s["ffn"])
    for name, shape, dtype, _ in plan:
        w.add_tensor_info(name, shape, np.dtype(dtype),
                          int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, (name, shape, dtype, make) in enumerate(plan):
        x = make()
        assert x.shape == shape and x.dtype == dtype, name
        w.write_tensor_data(x)
        print(f"\r{k + 1}/{len(plan)} {name}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
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
