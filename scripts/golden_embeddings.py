#!/usr/bin/env python3
"""Golden sentence embeddings for pagoda-model's BERT encoder (all-MiniLM-L6-v2).

Reference: the sentence-transformers package (tested with sentence-transformers 6.3.0,
transformers 5.24.0, torch 2.15.0, on CPU in float32), which runs the folder's own pipeline:
modules.json -> Transformer (max_seq_length 256 from sentence_bert_config.json) -> mean
Pooling -> Normalize. The texts cover an empty string, whitespace, accents, CJK, emoji,
mixed case and punctuation, and one text longer than 256 tokens (truncated).

Usage: python3 scripts/golden_embeddings.py MODEL_DIR
  (MODEL_DIR: `pagoda show --path all-minilm`, the Hugging Face folder of the model)
Writes crates/pagoda-model/tests/golden/minilm_embeddings.json:
  {"model", "reference", "max_seq_length", "dimensions",
   "cases": [{"text", "tokens" (after truncation, [CLS]/[SEP] included), "truncated",
              "ids" (the input ids), "vector" (384 floats rounded to 7 digits)}]}
CI only reads the committed JSON; this script is run by hand when the cases change.
"""

import json
import os
import sys

import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "crates",
    "pagoda-model",
    "tests",
    "golden",
    "minilm_embeddings.json",
)

LONG = " ".join(
    f"Sentence number {i} talks about pagodas, temples and the towers of Kyoto."
    for i in range(30)
)

TEXTS = [
    "This is an example sentence.",
    "",
    "   ",
    "Héllo wörld! Ça va? naïve café résumé",
    "東京タワーと五重塔 — 日本の塔。",
    "Emoji 🚀🔥 and symbols: 3.14159, $100, 50% off!!!",
    "The QUICK brown fox JUMPS over the lazy dog; un-believable state-of-the-art.",
    LONG,
]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    model = SentenceTransformer(sys.argv[1], device="cpu")
    model.eval()
    max_len = model.max_seq_length
    features = model.tokenize(TEXTS)
    vectors = model.encode(
        TEXTS, batch_size=len(TEXTS), convert_to_numpy=True, normalize_embeddings=False
    )
    tok = model.tokenizer
    cases = []
    for i, text in enumerate(TEXTS):
        mask = features["attention_mask"][i].tolist()
        ids = [t for t, m in zip(features["input_ids"][i].tolist(), mask) if m]
        full = tok(text, truncation=False)["input_ids"]
        cases.append(
            {
                "text": text,
                "tokens": len(ids),
                "truncated": len(full) > max_len,
                "ids": ids,
                "vector": [round(float(v), 7) for v in vectors[i]],
            }
        )
    out = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "reference": f"sentence-transformers {sentence_transformers.__version__}, "
        f"transformers {transformers.__version__}, torch {torch.__version__} (CPU, float32)",
        "max_seq_length": max_len,
        "dimensions": int(vectors.shape[1]),
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} cases, tokens {[c['tokens'] for c in cases]}")


if __name__ == "__main__":
    main()
