#!/usr/bin/env python3
"""Extra tokenizer goldens for pagoda-model: llama.cpp's own tokenizer on the real GGUFs.

Complements tests/golden/tokenizer_*.json (scripts/reference/make_goldens.py) with harder
strings (CRLF, flags and ZWJ emoji, combining accents, apostrophe contractions, long digit
runs, runs of spaces and newlines, special-token text glued to words) and with the Qwen2.5
GGUF (byte-level BPE with the qwen2 pre-tokenizer), which the main goldens do not cover.

Reference: llama-cpp-python 0.3.36 (the build DESIGN.md's pitfall is about runs fine for
tokenizing: the model is opened with vocab_only=True, so no weights are loaded and no
generation happens). `Llama.tokenize(text, add_bos, special=True)`: special-token text maps
to its id; add_bos adds BOS only where the GGUF's tokenizer.ggml.add_bos_token says so.

Usage: python3 scripts/golden_tokenizer.py NAME=PATH.gguf ... (names: smollm2 gemma3 qwen2)
Writes crates/pagoda-model/tests/golden/tokenizer_extra_NAME.json in the format of
tests/golden/tokenizer_*.json.
"""

import hashlib
import json
import os
import sys

from llama_cpp import Llama

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "pagoda-model", "tests", "golden")

TEXTS = [
    "tabs\tand\r\nCRLF\r\n\r\n",
    "  two  spaces   three    four     ",
    "\n\n\n\nfour newlines then text\n \n",
    "don't you're I'll WE'VE it's O'Neil's",
    "flags 🇫🇷🇯🇵 family 👨\u200d👩\u200d👧\u200d👦 skin 👍🏽 crab 🦀",
    "combining e\u0301 vs é, Å vs A\u030a, ﬁ ligature",
    "Ελληνικά русский العربية עברית हिन्दी ไทย",
    "digits 1234567890123 0.000001 -42 1e10 ١٢٣",
    "x<|im_end|>y <|im_start|> z<|endoftext|>",
    "a<start_of_turn>b <end_of_turn>\n",
    "<0x0A> <unk> <pad> [multimodal]",
    "    indented code\n\tfn main() {\n\t\treturn;\n\t}\n",
    "URL https://example.com/a?b=c&d=e#f and email a.b@c.de",
    "!!!???... ---- ==== **** ____ ~~~~",
    " ",
    "\u00a0non-breaking\u2009thin\u3000ideographic",
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def piece(llm, tid):
    b = llm.detokenize([tid], special=True)
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(f"\\x{c:02x}" for c in b)


def main():
    os.makedirs(OUT, exist_ok=True)
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
        cases = []
        for text in TEXTS:
            for add_bos in (True, False):
                ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
                cases.append({
                    "text": text,
                    "add_bos": add_bos,
                    "ids": ids,
                    "pieces": [piece(llm, t) for t in ids],
                    "detokenized": llm.detokenize(ids, special=True).decode("utf-8", errors="replace"),
                })
        out = {
            "model": os.path.basename(path),
            "model_sha256": sha256(path),
            "source": "llama-cpp-python 0.3.36, Llama.tokenize(text.encode(), add_bos=..., special=True), vocab_only",
            "n_vocab": llm.n_vocab(),
            "bos_id": llm.token_bos(),
            "eos_id": llm.token_eos(),
            "cases": cases,
        }
        with open(os.path.join(OUT, f"tokenizer_extra_{name}.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(name, len(cases), "cases")


if __name__ == "__main__":
    main()
