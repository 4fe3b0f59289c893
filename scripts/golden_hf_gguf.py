#!/usr/bin/env python3
"""Checks GGUF files written by `pagoda quantize HF_FOLDER -o OUT.gguf` against references
Pagoda did not write, and makes the committed golden tests/golden/hf_gguf.json.

1. The tiny random folders tests/golden/tiny-llama (Llama, Llama 3 RoPE scaling, untied),
   tests/golden/tiny-qwen2 (Qwen2, Q/K/V biases, tied embeddings), tiny-qwen3 (QK-norm),
   tiny-smollm3 (NoPE layers, Llama's Q/K permutation) and tiny-mistral3 (YaRN attention factor
   and query temperature keys) are quantized by
   `pagoda quantize DIR -o X.gguf --method rtn --bits 8 --sym` (Q8_0; deterministic). For each:
   - llama.cpp (llama-cpp-python 0.3.x, vendored llama.cpp) loads the file, tokenizes a mixed
     sample, and runs it with logits for every position; the folder's tokenizer.json (Python
     `tokenizers`) and transformers' AutoTokenizer tokenize the same sample. llama.cpp must
     equal tokenizer.json; whether AutoTokenizer agrees is recorded: transformers 5 builds
     Qwen2's pre-tokenizer from its Qwen2Tokenizer class, not from tokenizer.json, and the tiny
     Qwen2 folder's tokenizer.json is GPT-2 style, so there (only) the two differ on digits.
     The golden keeps the token ids, the last position's full logits row and every position's
     first 8 logits.
   The Rust test crates/pagoda-compress/tests/it/hf_gguf.rs converts the folders the same way
   and checks Pagoda's logits on the written file against these (CI needs no Python).
2. Unquantized: the Rust test writes each folder as an F32 GGUF (PAGODA_HF_GGUF_KEEP=DIR keeps
   it); llama.cpp's logits on it are compared with transformers' on the folder
   (tests/golden/tiny-*/logits.json, float32 eager) and the largest difference is recorded.
3. With PAGODA_TEST_SMOLLM2_HF (an F16 Hugging Face folder of SmolLM2, e.g. made by
   scripts/make_hf_f16.py from the SmolLM2 GGUF), the same for that folder, RTN 4-bit: the
   tokenizer.ggml.pre chosen, AutoTokenizer vs llama.cpp token ids on the sample, and
   llama.cpp's top-1 next tokens printed beside Pagoda's (by hand: `pagoda run`).

Run from the repository root:
    cargo build -p pagoda-cli
    /root/.venvs/pagoda-ref/bin/python scripts/golden_hf_gguf.py [PAGODA_BIN]
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from llama_cpp import Llama, llama_cpp
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = (
    "Hello world! It's 2026: naïve café, 12345 + 0.5 = ?\n"
    "<|im_start|>user\n  tabs\tand  spaces<|im_end|>\n"
    "def f(x):\n    return x**2  # 😀 ünïcödé\n"
)


# Folders written as GGUF by Pagoda (families whose writer is not refused).
NAMES = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-smollm3", "tiny-mistral3"]


def pagoda_quantize(pagoda, folder, out, method="rtn", bits=8):
    args = [pagoda, "quantize", str(folder), "-o", str(out), "--method", method,
            "--bits", str(bits), "--force"]
    if bits == 8:
        args.append("--sym")
    subprocess.run(args, check=True)


def llama_run(path, text):
    llm = Llama(model_path=str(path), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    ids = llm.tokenize(text.encode(), add_bos=True, special=True)
    llm.reset()
    llm.eval(ids)
    n_vocab = llm.n_vocab()
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64).reshape(len(ids), n_vocab)
    return llm, ids, logits


def hf_ids(folder, text):
    tok = AutoTokenizer.from_pretrained(str(folder))
    return tok(text)["input_ids"]


def file_ids(folder, text):
    """The folder's tokenizer.json as it is (Python `tokenizers`), BOS as llama.cpp adds it."""
    import tokenizers
    return tokenizers.Tokenizer.from_file(str(Path(folder) / "tokenizer.json")).encode(text).ids


def one(pagoda, name, folder, tmp):
    out = Path(tmp) / f"{name}.gguf"
    pagoda_quantize(pagoda, folder, out)
    llm, ids, logits = llama_run(out, SAMPLE)
    ref = file_ids(folder, SAMPLE)
    assert ids == ref, f"{name}: llama.cpp {ids} != tokenizer.json {ref}"
    auto = hf_ids(folder, SAMPLE)
    print(f"{name}: {len(ids)} tokens, llama.cpp == tokenizer.json; == AutoTokenizer: {ids == auto}")
    return {
        "same_as_auto_tokenizer": ids == auto,
        "folder": str(folder.relative_to(ROOT)),
        "command": f"pagoda quantize {folder.relative_to(ROOT)} -o X.gguf --method rtn --bits 8 --sym",
        "text": SAMPLE,
        "token_ids": ids,
        "n_vocab": int(logits.shape[1]),
        "last_logits": [round(float(x), 6) for x in logits[-1]],
        "first8_logits": [[round(float(x), 6) for x in row[:8]] for row in logits],
    }


def main():
    pagoda = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/debug/pagoda")
    golden = {
        "source": "llama-cpp-python " + __import__("llama_cpp").__version__
        + " (vendored llama.cpp), CPU, n_ctx=256, logits for every position; token ids equal "
        "to transformers AutoTokenizer on the folder",
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in NAMES:
            golden["models"][name] = one(pagoda, name, ROOT / "tests/golden" / name, tmp)
        keep = Path(tmp) / "keep"
        keep.mkdir()
        subprocess.run(["cargo", "test", "-q", "-p", "pagoda-compress", "--test", "it",
                        "hf_gguf::unquantized"], check=True, cwd=ROOT,
                       env={**os.environ, "PAGODA_HF_GGUF_KEEP": str(keep)})
        for name in NAMES:
            ref = json.loads((ROOT / "tests/golden" / name / "logits.json").read_text())
            ids = ref["token_ids"]
            want = np.array(ref["logits"], dtype=np.float64).reshape(len(ids), -1)
            llm = Llama(model_path=str(keep / f"{name}-f32.gguf"), n_ctx=256, n_threads=2,
                        logits_all=True, verbose=False)
            llm.reset()
            llm.eval(ids)
            got = np.array(llm.scores[: len(ids)], dtype=np.float64).reshape(len(ids), -1)
            d = float(np.abs(got - want).max())
            same = bool((got.argmax(1) == want.argmax(1)).all())
            assert d < 0.01 * want.std() and same, (name, d)
            print(f"{name}: F32 GGUF in llama.cpp vs transformers on the folder: max |diff| "
                  f"{d:.2e} (logits sd {want.std():.2f}), argmax equal: {same}")
            golden["models"][name]["f32_llama_cpp_vs_transformers_max_abs"] = round(d, 6)
        smol = os.environ.get("PAGODA_TEST_SMOLLM2_HF")
        if smol:
            out = Path(tmp) / "smol.gguf"
            pagoda_quantize(pagoda, smol, out, bits=4)
            llm, ids, logits = llama_run(out, SAMPLE)
            ref = hf_ids(smol, SAMPLE)
            print("SmolLM2 F16 folder -> GGUF Q4:", "tokens equal" if ids == ref else "TOKENS DIFFER",
                  len(ids), "tokens")
            from gguf import GGUFReader
            r = GGUFReader(str(out))
            print("tokenizer.ggml.pre =", r.fields["tokenizer.ggml.pre"].contents())
            print("llama.cpp top-1 at the last 5 positions:",
                  [int(np.argmax(row)) for row in logits[-5:]])
    path = ROOT / "tests/golden/hf_gguf.json"
    path.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
