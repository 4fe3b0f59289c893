#!/usr/bin/env python3
"""Token ids llama.cpp gives for pre-tokenizers it ships no ggml-vocab test file for (Tekken of
Mistral/Ministral 3, gpt-4o of gpt-oss, llama.cpp's `default`, smaug-bpe, exaone, deepseek-llm, stablelm2): a
shipped vocabulary (llama-bpe's or qwen2's, from the llama-cpp-python 0.3.36 sdist's
vendor/llama.cpp/models/) with only `tokenizer.ggml.pre` changed, tokenized by llama.cpp
(`vocab_only`, no BOS, special-token text read as text, as test-tokenizer-0 does) on the texts
of ggml-vocab-qwen35.gguf.inp.

CI never runs this script: its outputs are committed as
crates/pagoda-model/tests/golden/ggml_vocab_pre/BASE-as-PRE.out (one line of ids per text).
crates/pagoda-model/tests/it/ggml_vocab.rs builds the same relabelled vocabulary in memory and
compares.

    bash scripts/reference/setup.sh
    /root/.venvs/pagoda-ref/bin/python scripts/reference/golden_vocab_pre.py SDIST_MODELS_DIR
"""
from __future__ import annotations

import os
import sys
import tempfile

import gguf
import llama_cpp

CASES = [
    ("llama-bpe", "tekken"),
    ("llama-bpe", "gpt-4o"),
    ("llama-bpe", "default"),
    ("llama-bpe", "smaug-bpe"),
    ("llama-bpe", "exaone"),
    ("llama-bpe", "deepseek-llm"),
    ("qwen2", "stablelm2"),
]
SEP = "\n__ggml_vocab_test__\n"
OUT = os.path.join(os.path.dirname(__file__), "../../crates/pagoda-model/tests/golden/ggml_vocab_pre")


def texts(models: str) -> list[str]:
    raw = open(os.path.join(models, "ggml-vocab-qwen35.gguf.inp"), encoding="utf-8").read()
    out, pos = [], 0
    while pos < len(raw):
        n = raw.find(SEP, pos)
        if n < 0:
            out.append(raw[pos:])
            break
        out.append(raw[pos:n])
        pos = n + len(SEP)
    return out


def relabel(models: str, base: str, pre: str, path: str) -> None:
    r = gguf.GGUFReader(os.path.join(models, f"ggml-vocab-{base}.gguf"))
    w = gguf.GGUFWriter(path, arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = pre if k == "tokenizer.ggml.pre" else f.contents()
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, v, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    models = sys.argv[1]
    cases = texts(models)
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for base, pre in CASES:
            path = os.path.join(tmp, f"{base}-as-{pre}.gguf")
            relabel(models, base, pre, path)
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            with open(os.path.join(OUT, f"{base}-as-{pre}.out"), "w") as f:
                for t in cases:
                    ids = llm.tokenize(t.encode("utf-8"), add_bos=False, special=False)
                    f.write(" ".join(map(str, ids)) + "\n")
            print(base, "as", pre, len(cases), "texts")


if __name__ == "__main__":
    main()
