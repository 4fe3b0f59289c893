#!/usr/bin/env python3
"""Checks Hugging Face GPTQ/AWQ folders written by `pagoda quantize --format gptq|awq` against
references Pagoda did not write, and makes the committed goldens of that export.

1. The tiny random Llama (tests/golden/tiny-llama, an F32 Hugging Face folder) is quantized by
   `pagoda quantize` into
     tests/golden/tiny-llama-pagoda-gptq   GPTQ method, 4-bit asymmetric, group 32, act-order
                                           (g_idx not monotone), checkpoint_format "gptq" (v1)
     tests/golden/tiny-llama-pagoda-awq    AWQ method (scales folded into the norms), 4-bit
                                           group 32, GEMM packing
   Every linear is dequantized by AutoGPTQ's QuantLinear (auto_gptq 0.7.1 qlinear_cuda.py, its
   CPU forward on an identity matrix) or AutoAWQ's dequantize_gemm (autoawq 0.2.9), loaded
   without the packages' CUDA parts (as scripts/golden_gptq_awq.py does), and compared with
   the weights Pagoda's own loader makes of the same folder (`weights_dump` example).
   transformers' LlamaForCausalLM (float32, eager) runs on the reference-dequantized weights;
   its logits are compared with Pagoda's on the folder (`logits` example). Each folder gets
   golden.json in the format of scripts/golden_gptq_awq.py, which the Rust test
   crates/pagoda-model/tests/it/hf_quant.rs reads (CI needs no Python).
2. With PAGODA_TEST_SMOLLM2 (the SmolLM2 GGUF), the same run as GGUF and as a GPTQ folder
   (RTN, 4-bit, group 32): the reference-dequantized folder against Pagoda's GGUF output
   (Q/K rows put back from llama.cpp's RoPE interleaving), the folder's generated
   tokenizer.json through the Python `tokenizers` and transformers' AutoTokenizer against
   Pagoda's tokenizer on a sample text, and transformers' logits on the folder against
   Pagoda's on the GGUF.

Run by hand from the repository root (the numbers are in docs/quantization.md):
    cargo build --release -p pagoda-cli -p pagoda-model --examples
    /root/.venvs/pagoda-gptq/bin/python scripts/golden_hf_export.py
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
BASE = GOLDEN / "tiny-llama"
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
PROFILE = os.environ.get("PAGODA_PROFILE", "release")
PAGODA = TARGET / PROFILE / "pagoda"
EXAMPLES = TARGET / PROFILE / "examples"
LINEARS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GOLDEN_WEIGHTS = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"]


def load_file_module(package: str, rel: str, name: str):
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not installed: pip install --no-deps auto-gptq==0.7.1 autoawq==0.2.9")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    mspec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    return mod


REFS = {
    "gptq": load_file_module("auto_gptq", "nn_modules/qlinear/qlinear_cuda.py", "autogptq_qlinear"),
    "awq": load_file_module("awq", "utils/packing_utils.py", "awq_packing_utils"),
}


def run(*args) -> str:
    out = subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True)
    return out.stdout


def quantize(model, out: Path, *flags):
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    print(" ".join(["pagoda quantize", str(model), "-o", str(out), *flags]), file=sys.stderr)
    run(PAGODA, "quantize", model, "-o", out, *flags)


def pagoda_weights(model: Path, names, text=None):
    args = [EXAMPLES / "weights_dump", model, ",".join(names)]
    if text is not None:
        args.append(text)
    d = json.loads(run(*args))
    tensors = {
        n: np.array(t["values"], np.float32).reshape(t["shape"]) for n, t in d["tensors"].items()
    }
    return tensors, d["ids"]


def pagoda_logits(model: Path, ids):
    return np.array(json.loads(run(EXAMPLES / "logits", model, json.dumps(ids))), np.float32)


def reference_dequant(folder: Path, module: str, qc, tensors):
    """[out, in] f32 from the reference unpacker of the folder's quant_method."""
    qweight = tensors[f"{module}.qweight"]
    scales = tensors[f"{module}.scales"].astype(np.float32)
    qzeros = tensors[f"{module}.qzeros"]
    out_f = scales.shape[1]
    group = qc["group_size"]
    if qc["quant_method"] == "gptq":
        bits = qc["bits"]
        in_f = qweight.shape[0] * 32 // bits
        ql = REFS["gptq"].QuantLinear(bits, group, in_f, out_f, bias=False, weight_dtype=torch.float32)
        ql.qweight = torch.from_numpy(qweight.copy())
        ql.qzeros = torch.from_numpy(qzeros.copy())
        ql.scales = torch.from_numpy(scales)
        ql.g_idx = torch.from_numpy(tensors[f"{module}.g_idx"].copy())
        with torch.no_grad():
            wt = ql(torch.eye(in_f, dtype=torch.float32))
        return wt.T.contiguous().numpy().astype(np.float32)
    w = REFS["awq"].dequantize_gemm(
        torch.from_numpy(qweight.copy()),
        torch.from_numpy(qzeros.copy()),
        torch.from_numpy(scales),
        4,
        group,
    )
    return w.T.contiguous().numpy().astype(np.float32)


def hf_dequantized_state(folder: Path):
    """The folder's state dict in f32 with every quantized linear dequantized by the reference;
    also {canonical linear name: (reference [out, in], max scale)}."""
    cfg = json.loads((folder / "config.json").read_text())
    qc = cfg["quantization_config"]
    tensors = load_file(str(folder / "model.safetensors"))
    state, linears = {}, {}
    modules = sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith(".qweight")})
    for module in modules:
        ref = reference_dequant(folder, module, qc, tensors)
        state[f"{module}.weight"] = ref
        layer = int(module.split(".")[2])
        sub = [g for g, h in LINEARS.items() if module.endswith(h)][0]
        linears[f"blk.{layer}.{sub}.weight"] = (ref, float(tensors[f"{module}.scales"].astype(np.float32).max()))
    for k, v in tensors.items():
        if k.rsplit(".", 1)[1] not in ("qweight", "qzeros", "scales", "g_idx"):
            state[k] = v.astype(np.float32)
    return cfg, qc, state, linears


def transformers_logits(folder: Path, state, ids):
    config = transformers.AutoConfig.from_pretrained(folder)
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.LlamaForCausalLM(config).eval().float()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    assert not unexpected and all("rotary" in m or m == "lm_head.weight" for m in missing), (missing, unexpected)
    if "lm_head.weight" in missing:
        model.tie_weights()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def tiny(name: str, flags, description: str):
    folder = GOLDEN / name
    quantize(BASE, folder, *flags)
    cfg, qc, state, linears = hf_dequantized_state(folder)
    mine, _ = pagoda_weights(folder, list(linears))
    worst = 0.0
    for n, (ref, max_scale) in linears.items():
        d = float(np.abs(mine[n] - ref).max())
        worst = max(worst, d / max_scale)
    ids = json.loads((BASE / "logits.json").read_text())["token_ids"]
    ref_logits = transformers_logits(folder, state, ids)
    our_logits = pagoda_logits(folder, ids)
    dl = float(np.abs(ref_logits - our_logits).max())
    print(
        f"{name}: Pagoda's loader vs {qc['quant_method']} reference: max |dw| = {worst:.3e} of the "
        f"largest scale over {len(linears)} linears; logits max |d| = {dl:.3e} "
        f"(max |logit| {float(np.abs(ref_logits).max()):.3f})"
    )
    golden = {
        "reference": {
            "gptq": "auto_gptq 0.7.1 QuantLinear (qlinear_cuda.py) CPU forward on an identity matrix",
            "awq": "autoawq 0.2.9 awq.utils.packing_utils.dequantize_gemm",
        }[qc["quant_method"]]
        + f"; folder written by `pagoda quantize {' '.join(flags)}` ({description})"
        + f"; logits: transformers {transformers.__version__}, torch {torch.__version__}, float32, eager",
        "scheme": qc,
        "token_ids": ids,
        "logits": [[float(np.float32(x)) for x in row] for row in ref_logits],
        "weights": {
            canon: {
                "hf_name": "model.layers.{}.{}.weight".format(canon.split(".")[1], LINEARS[canon.split(".")[2]]),
                "shape": list(linears[canon][0].shape),
                "values": [[float(x) for x in row] for row in linears[canon][0]],
                "max_scale": linears[canon][1],
            }
            for canon in GOLDEN_WEIGHTS
        },
    }
    (folder / "golden.json").write_text(json.dumps(golden, separators=(",", ":")) + "\n")


def unpermute_llama(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's conversion permute, undone: GGUF row (h, i, j) is HF row (h, j, i)."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def smollm2(gguf: Path):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        flags = ["--method", "rtn", "--bits", "4", "--group-size", "32"]
        quantize(gguf, tmp / "smol.gguf", *flags)
        quantize(gguf, tmp / "smol-gptq", *flags, "--format", "gptq")
        folder = tmp / "smol-gptq"
        cfg, qc, state, linears = hf_dequantized_state(folder)
        names = sorted(linears)
        text = (
            "Hello world! Pagoda's quantizer writes GPTQ folders: 3.14159, naïve café, 日本語, "
            "def f(x):\n    return x ** 2  # code\n\n<|im_start|>user\nhi<|im_end|>"
        )
        from_gguf, ids = pagoda_weights(tmp / "smol.gguf", names, text)
        worst = 0.0
        for n in names:
            g = from_gguf[n]
            if ".attn_q." in n:
                g = unpermute_llama(g, cfg["num_attention_heads"])
            elif ".attn_k." in n:
                g = unpermute_llama(g, cfg["num_key_value_heads"])
            ref, max_scale = linears[n]
            worst = max(worst, float(np.abs(g - ref).max()) / max_scale)
        print(
            f"SmolLM2 RTN 4-bit g32: GPTQ folder via AutoGPTQ vs the GGUF output via Pagoda: "
            f"max |dw| = {worst:.3e} of the largest scale over {len(names)} linears"
        )
        import tokenizers

        hf_ids = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
        auto = transformers.AutoTokenizer.from_pretrained(folder)
        auto_ids = auto(text, add_special_tokens=False)["input_ids"]
        print(
            f"SmolLM2 tokenizer.json: tokenizers {'==' if hf_ids == ids else '!='} Pagoda "
            f"({len(ids)} tokens), AutoTokenizer {'==' if auto_ids == ids else '!='} Pagoda"
        )
        sample = ids[:24]
        ref_logits = transformers_logits(folder, state, sample)
        for what, path in [("the GGUF", tmp / "smol.gguf"), ("the folder", folder)]:
            our = pagoda_logits(path, sample)
            dl = np.abs(ref_logits - our)
            agree = float(np.mean(ref_logits.argmax(-1) == our.argmax(-1)))
            print(
                f"SmolLM2 logits on {len(sample)} tokens: transformers on the dequantized folder vs "
                f"Pagoda on {what}: max |d| = {float(dl.max()):.3e}, mean |d| = {float(dl.mean()):.3e} "
                f"(max |logit| {float(np.abs(ref_logits).max()):.1f}), argmax agreement {agree:.2%}"
            )


def main():
    torch.manual_seed(0)
    tiny(
        "tiny-llama-pagoda-gptq",
        ["--method", "gptq", "--bits", "4", "--group-size", "32", "--act-order", "--format", "gptq"],
        "GPTQ, act-order",
    )
    tiny(
        "tiny-llama-pagoda-awq",
        ["--method", "awq", "--bits", "4", "--group-size", "32", "--format", "awq"],
        "AWQ, scales folded into the norms",
    )
    smol = os.environ.get("PAGODA_TEST_SMOLLM2")
    if smol:
        smollm2(Path(smol))
    else:
        print("PAGODA_TEST_SMOLLM2 unset: SmolLM2 checks skipped", file=sys.stderr)


if __name__ == "__main__":
    main()
