#!/usr/bin/env python3
"""Tiny GPTQ and AWQ checkpoint folders, with golden dequantized weights and logits, for
pagoda-model's direct loading of quantized Hugging Face checkpoints (crates/pagoda-model/src/hf_quant.rs).

Base model: tests/golden/tiny-llama (random Llama, hidden 64, intermediate 128, kv dim 32: every
in_features a multiple of 32). Its seven linear layers per block are quantized round-to-nearest
in NumPy and packed by this script in the published layouts (written down in hf_quant.rs):

  tiny-llama-gptq        GPTQ 4-bit, group 32, asymmetric, checkpoint_format "gptq" (v1: zero - 1 stored)
  tiny-llama-gptq-act    the same with desc_act: a random column order assigns the groups, so g_idx
                         is not monotone and blocks of 32 columns straddle groups
  tiny-llama-gptq8       GPTQ 8-bit, group 64, symmetric (zero 128), v1
  tiny-llama-awq         AWQ GEMM 4-bit, group 32, zero_point (interleaved nibble order)

Embeddings, norms and lm_head are stored as F16, as such checkpoints carry them.

The dequantization reference is not ours: AutoGPTQ's QuantLinear (auto_gptq 0.7.1,
nn_modules/qlinear/qlinear_cuda.py: its CPU forward path unpacks qweight/qzeros, adds 1 to the
zeros and applies g_idx) run on an identity matrix, and AutoAWQ's `dequantize_gemm` (autoawq
0.2.9, awq/utils/packing_utils.py). Both files are loaded on their own (importlib) so that
neither package's __init__ (CUDA kernels, model zoo) is needed:
    pip install torch transformers safetensors numpy
    pip install --no-deps auto-gptq==0.7.1 autoawq==0.2.9
The logits are transformers' LlamaForCausalLM (float32, eager attention) with the quantized
linears replaced by those references' dequantized weights and every other tensor read back from
the folder.

Each folder gets golden.json: {"reference", "scheme", "token_ids", "logits" [n, vocab],
"weights": {canonical name: {"hf_name", "shape" [out, in], "values" [out][in], "max_scale"}}}.
CI only reads the committed files; run this by hand (python3 scripts/golden_gptq_awq.py).
"""

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
BASE = GOLDEN / "tiny-llama"
LINEARS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]
# Layer 0's q_proj and layer 1's down_proj (in_features 128: four groups of 32) go in golden.json.
GOLDEN_WEIGHTS = {
    "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj",
    "blk.1.ffn_down.weight": "model.layers.1.mlp.down_proj",
}
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def load_file_module(package: str, rel: str, name: str):
    """Loads one source file of an installed package without running the package's __init__."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not installed: pip install --no-deps auto-gptq==0.7.1 autoawq==0.2.9")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    mspec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    return mod


def rtn(w: np.ndarray, bits: int, group_of: np.ndarray, n_groups: int, sym: bool):
    """Round-to-nearest per (group, output row). w [out, in] f32 -> codes [out, in], scales f16
    [groups, out], zeros int [groups, out]. Asymmetric zeros are kept in 1..maxq so that GPTQ v1's
    stored zero - 1 never wraps (AutoGPTQ's packer corrupts neighbouring nibbles when it does)."""
    maxq = 2**bits - 1
    out_f, _ = w.shape
    scales = np.zeros((n_groups, out_f), np.float16)
    zeros = np.zeros((n_groups, out_f), np.int64)
    codes = np.zeros(w.shape, np.int64)
    for g in range(n_groups):
        cols = np.nonzero(group_of == g)[0]
        block = w[:, cols]
        if sym:
            s = np.maximum(np.abs(block).max(axis=1), 1e-6) / (maxq / 2)
            s = s.astype(np.float16).astype(np.float32)
            z = np.full(out_f, (maxq + 1) // 2)
        else:
            lo, hi = block.min(axis=1), block.max(axis=1)
            s = np.maximum(hi - lo, 1e-6) / maxq
            s = s.astype(np.float16).astype(np.float32)
            z = np.clip(np.round(-lo / s), 1, maxq).astype(np.int64)
        q = np.clip(np.round(block / s[:, None]) + z[:, None], 0, maxq)
        codes[:, cols] = q
        scales[g] = s.astype(np.float16)
        zeros[g] = z
    return codes, scales, zeros


def pack_gptq(codes, scales, zeros, g_idx, bits, v1=True):
    """qweight I32 [in/pack, out] along the input dim, qzeros I32 [groups, out/pack] along the
    output dim, lowest bits first; v1 stores zero - 1."""
    pack = 32 // bits
    out_f, in_f = codes.shape
    q = codes.T.astype(np.uint32)  # [in, out]
    qweight = np.zeros((in_f // pack, out_f), np.uint32)
    for k in range(pack):
        qweight |= q[k::pack] << np.uint32(bits * k)
    z = (zeros - 1 if v1 else zeros).astype(np.uint32)
    qzeros = np.zeros((zeros.shape[0], out_f // pack), np.uint32)
    for k in range(pack):
        qzeros |= z[:, k::pack] << np.uint32(bits * k)
    return {
        "qweight": qweight.view(np.int32),
        "qzeros": qzeros.view(np.int32),
        "scales": scales,
        "g_idx": g_idx.astype(np.int32),
    }


def pack_awq(codes, scales, zeros):
    """qweight I32 [in, out/8], qzeros I32 [groups, out/8]: packed along the output dim, nibble
    p of word k holding column 8k + AWQ_ORDER[p]."""
    def pack_cols(m):  # m [rows, out] -> [rows, out/8]
        m = m.astype(np.uint32)
        out = np.zeros((m.shape[0], m.shape[1] // 8), np.uint32)
        for p, c in enumerate(AWQ_ORDER):
            out |= m[:, c::8] << np.uint32(4 * p)
        return out.view(np.int32)

    return {"qweight": pack_cols(codes.T), "qzeros": pack_cols(zeros), "scales": scales}


def gptq_reference(qlinear_mod, parts, bits, group_size, in_f, out_f):
    """AutoGPTQ's own CPU dequantization: forward of an identity matrix through QuantLinear."""
    ql = qlinear_mod.QuantLinear(bits, group_size, in_f, out_f, bias=False, weight_dtype=torch.float32)
    ql.qweight = torch.from_numpy(parts["qweight"].copy())
    ql.qzeros = torch.from_numpy(parts["qzeros"].copy())
    ql.scales = torch.from_numpy(parts["scales"].astype(np.float32))
    ql.g_idx = torch.from_numpy(parts["g_idx"].copy())
    with torch.no_grad():
        wt = ql(torch.eye(in_f, dtype=torch.float32))  # [in, out] = W^T
    return wt.T.contiguous().numpy().astype(np.float32)


def awq_reference(awq_mod, parts, group_size):
    w = awq_mod.dequantize_gemm(
        torch.from_numpy(parts["qweight"].copy()),
        torch.from_numpy(parts["qzeros"].copy()),
        torch.from_numpy(parts["scales"].astype(np.float32)),
        4,
        group_size,
    )
    return w.T.contiguous().numpy().astype(np.float32)


def make(name: str, method: str, bits: int, group_size: int, sym: bool, act: bool, refs):
    base = load_file(str(BASE / "model.safetensors"))
    cfg = json.loads((BASE / "config.json").read_text())
    rng = np.random.default_rng(1234)
    folder = GOLDEN / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        shutil.copy(BASE / f, folder / f)
    tensors = {}
    dequant = {}
    max_scale = {}
    for key, value in base.items():
        module = key[: -len(".weight")] if key.endswith(".weight") else None
        if module is None or not any(module.endswith(l) for l in LINEARS):
            tensors[key] = value.astype(np.float16)
            continue
        w = value.astype(np.float32)
        out_f, in_f = w.shape
        n_groups = in_f // group_size
        if act:
            perm = rng.permutation(in_f)  # the act-order column order
            group_of = np.empty(in_f, np.int64)
            group_of[perm] = np.arange(in_f) // group_size
        else:
            group_of = np.arange(in_f) // group_size
        codes, scales, zeros = rtn(w, bits, group_of, n_groups, sym)
        if method == "gptq":
            parts = pack_gptq(codes, scales, zeros, group_of, bits)
            ref = gptq_reference(refs["gptq"], parts, bits, group_size, in_f, out_f)
        else:
            parts = pack_awq(codes, scales, zeros)
            ref = awq_reference(refs["awq"], parts, group_size)
        # The reference must agree with the codes this script meant to write.
        mine = scales.astype(np.float32)[group_of].T * (codes - zeros[group_of].T)
        assert np.array_equal(ref, mine.astype(np.float32)), f"{name} {module}: reference disagrees"
        for part, arr in parts.items():
            tensors[f"{module}.{part}"] = arr
        dequant[module] = ref
        max_scale[module] = float(scales.astype(np.float32).max())
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    qc = {"quant_method": method, "bits": bits, "group_size": group_size}
    if method == "gptq":
        qc.update({"desc_act": act, "sym": sym, "checkpoint_format": "gptq", "true_sequential": True})
    else:
        qc.update({"version": "gemm", "zero_point": True})
    cfg["quantization_config"] = qc
    cfg["dtype"] = "float16"
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    # Logits: transformers on the dequantized model.
    config = transformers.AutoConfig.from_pretrained(BASE)
    model = transformers.LlamaForCausalLM(config).eval().float()
    state = {}
    for key in base:
        module = key[: -len(".weight")]
        if module in dequant:
            state[key] = torch.from_numpy(dequant[module])
        else:
            state[key] = torch.from_numpy(tensors[key].astype(np.float32))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    model.config._attn_implementation = "eager"
    base_golden = json.loads((BASE / "logits.json").read_text())
    ids = base_golden["token_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    golden = {
        "reference": {
            "gptq": "auto_gptq 0.7.1 QuantLinear (qlinear_cuda.py) CPU forward on an identity matrix",
            "awq": "autoawq 0.2.9 awq.utils.packing_utils.dequantize_gemm",
        }[method]
        + f"; logits: transformers {transformers.__version__}, torch {torch.__version__}, float32, eager",
        "scheme": qc,
        "token_ids": ids,
        "logits": [[float(np.float32(x)) for x in row] for row in logits],
        "weights": {
            canon: {
                "hf_name": f"{module}.weight",
                "shape": list(dequant[module].shape),
                "values": [[float(x) for x in row] for row in dequant[module]],
                "max_scale": max_scale[module],
            }
            for canon, module in GOLDEN_WEIGHTS.items()
        },
    }
    (folder / "golden.json").write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    print(f"wrote {folder}")


def main():
    refs = {
        "gptq": load_file_module("auto_gptq", "nn_modules/qlinear/qlinear_cuda.py", "autogptq_qlinear"),
        "awq": load_file_module("awq", "utils/packing_utils.py", "awq_packing_utils"),
    }
    torch.manual_seed(0)
    make("tiny-llama-gptq", "gptq", 4, 32, sym=False, act=False, refs=refs)
    make("tiny-llama-gptq-act", "gptq", 4, 32, sym=False, act=True, refs=refs)
    make("tiny-llama-gptq8", "gptq", 8, 64, sym=True, act=False, refs=refs)
    make("tiny-llama-awq", "awq", 4, 32, sym=False, act=False, refs=refs)


if __name__ == "__main__":
    main()
