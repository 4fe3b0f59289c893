"""How far llama.cpp is from itself: its two attention paths (flash attention off / on) on the
same GGUF and prompts as tests/golden/llamacpp_<model>.json. Prints, per prompt, the largest
logit difference over all prompt positions and how many greedy tokens agree.

This bounds what "matches llama.cpp" can mean for Pagoda (docs/reference.md, "How close is
close"). Usage: $PY scripts/reference/llamacpp_self_consistency.py MODEL.gguf GOLDEN.json
"""
import json
import sys

import numpy as np
from llama_cpp import Llama


def main() -> None:
    model, golden_path = sys.argv[1], sys.argv[2]
    golden = json.load(open(golden_path))
    runs = {}
    for flash in (False, True):
        m = Llama(model, n_ctx=512, n_threads=2, logits_all=True, flash_attn=flash, verbose=False)
        per_prompt = []
        for p in golden["prompts"]:
            ids = p["prompt_ids"]
            m.reset()
            m.eval(ids)
            logits = np.array(m.scores[: len(ids)])
            greedy = []
            for _ in range(32):
                tok = int(np.argmax(m.scores[m.n_tokens - 1]))
                greedy.append(tok)
                m.eval([tok])
            per_prompt.append((logits, greedy))
        runs[flash] = per_prompt
    for i, p in enumerate(golden["prompts"]):
        (la, ga), (lb, gb) = runs[False][i], runs[True][i]
        same = next((k for k in range(32) if ga[k] != gb[k]), 32)
        print(
            f"{p['name']}: flash-attn off vs on: max logit difference {np.abs(la - lb).max():.3f}, "
            f"greedy identical for {same} of 32 tokens"
        )


if __name__ == "__main__":
    main()
