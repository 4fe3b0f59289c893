#!/usr/bin/env python3
"""Golden values for `pagoda eval` from Hugging Face transformers, on tests/golden/tiny-llama.

Writes tests/golden/eval_tiny_llama.json, which crates/pagoda-compress/tests/it/eval_golden.rs
compares Pagoda's evaluation against. CI never runs this script: its output is committed.

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch transformers safetensors numpy
    /tmp/ref/bin/python scripts/golden_eval.py            # the tiny Llama (no model file needed)

With `smollm2 PATH.gguf` (also pip install gguf accelerate) it writes tests/golden/eval_smollm2.json:
the strided perplexity of SmolLM2-135M-Instruct Q4_1 over the first section of Pagoda's built-in
evaluation text, computed by transformers on the GGUF's weights dequantized to float32. Pagoda
multiplies by the Q4_1 blocks with activations quantized to 8 bits (as llama.cpp does), so its
figure differs by a fraction of a percent; the test allows 1%.

    /tmp/ref/bin/python scripts/golden_eval.py smollm2 "$(pagoda show --path smollm2:135m)"

(torch from PyPI pulls the CUDA runtime wheels; it runs on the CPU all the same. Where the
PyTorch CPU index is reachable, `--index-url https://download.pytorch.org/whl/cpu` is smaller.)

What is computed, independently of Pagoda's code:

- Perplexity with the strided sliding-window loop of the transformers documentation
  ("Perplexity of fixed-length models"): windows of `max_length` tokens every `stride` tokens,
  labels of the tokens an earlier window scored set to -100. The text is tokenized with the
  model's tokenizer and its special tokens (BOS, from the tokenizer's post-processor). The
  negative log-likelihood is summed in float64 over log_softmax(logits.double()), and checked
  against the documentation's own `outputs.loss * n_valid` accumulation.
- Multiple-choice log-likelihoods the way lm-evaluation-harness scores them (`HFLM._encode_pair`
  and `_loglikelihood_tokens`): trailing whitespace of the context moved to the continuation,
  continuation = tokens of context+choice after the context's tokens, input = (context +
  continuation)[:-1], the sum of the continuation tokens' log-probabilities. Tokens are encoded
  with special tokens (BOS), as Pagoda does; lm-eval's HF backend adds none by default, which
  only changes the prompt, not the scoring rule. acc / acc_norm use numpy's argmax over the
  sums and over the sums divided by the choice's UTF-8 byte length.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "golden" / "tiny-llama"
OUT = ROOT / "tests" / "golden" / "eval_tiny_llama.json"

TEXT = (
    "The river rose slowly through the night, and by morning the low fields were under water. "
    "Farmers moved their cattle to the higher ground near the church, where the old stone wall "
    "kept the wind away. Nobody was hurt. In the afternoon the rain stopped, the clouds broke, "
    "and children came out to float paper boats on the new lake that covered the road to town. "
    "By the end of the week the water had gone, leaving a thin layer of grey silt on everything."
)

# (ctx, stride): several windows with overlap, a stride of one less than the window, and the
# model's whole context (one window).
WINDOWS = [(64, 32), (48, 47), (100, 1), (256, 128)]

QUESTIONS = [
    {"context": "Question: What is the capital of France?\nAnswer:", "choices": [" Paris", " Berlin", " Madrid"], "gold": 0},
    # trailing space in the context: lm-eval moves it to the front of the choice
    {"context": "The cat sat on the ", "choices": ["mat", "moon", "roof of the house"], "gold": 0},
    {"context": "2 + 2 =", "choices": [" 4", " 5", " 22", " four"], "gold": 0},
    # non-ASCII: byte length differs from character length
    {"context": "Caf", "choices": ["é au lait", "eteria", "é"], "gold": 0},
]


def nll_sum_logsoftmax(model, window_ids: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    with torch.no_grad():
        logits = model(window_ids.unsqueeze(0)).logits[0]  # [len, vocab]
    lp = torch.log_softmax(logits[:-1].double(), dim=-1)
    shifted = labels[1:]
    mask = shifted != -100
    picked = lp[mask].gather(1, shifted[mask].unsqueeze(1)).squeeze(1)
    return float(-picked.sum()), int(mask.sum())


def strided_perplexity(model, ids: torch.Tensor, max_length: int, stride: int) -> dict:
    seq_len = ids.size(0)
    nll_sum, n_scored, windows = 0.0, 0, 0
    docs_sum = 0.0  # the documentation's accumulation: outputs.loss * valid tokens
    prev_end = 0
    for begin in range(0, seq_len, stride):
        end = min(begin + max_length, seq_len)
        trg_len = end - prev_end
        input_ids = ids[begin:end]
        target_ids = input_ids.clone()
        target_ids[:-trg_len] = -100
        s, n = nll_sum_logsoftmax(model, input_ids, target_ids)
        with torch.no_grad():
            out = model(input_ids.unsqueeze(0), labels=target_ids.unsqueeze(0))
        docs_sum += float(out.loss) * n
        nll_sum += s
        n_scored += n
        windows += 1
        prev_end = end
        if end == seq_len:
            break
    assert n_scored == seq_len - 1, (n_scored, seq_len)
    assert abs(docs_sum - nll_sum) < 1e-3 * max(1.0, abs(nll_sum)), (docs_sum, nll_sum)
    mean = nll_sum / n_scored
    return {
        "ctx": max_length,
        "stride": stride,
        "windows": windows,
        "tokens_scored": n_scored,
        "nll_sum": nll_sum,
        "mean_nll": mean,
        "perplexity": math.exp(mean),
    }


def encode_pair(tok, context: str, continuation: str):
    """lm-eval's HFLM._encode_pair, with special tokens."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok(context + continuation, add_special_tokens=True)["input_ids"]
    ctx = tok(context, add_special_tokens=True)["input_ids"]
    return ctx, whole[len(ctx):]


def choice_loglikelihood(model, ctx: list[int], cont: list[int]) -> float:
    inp = torch.tensor((ctx + cont)[:-1])
    with torch.no_grad():
        logits = model(inp.unsqueeze(0)).logits[0]
    lp = torch.log_softmax(logits.double(), dim=-1)
    rows = lp[len(ctx) - 1 : len(ctx) - 1 + len(cont)]
    return float(rows.gather(1, torch.tensor(cont).unsqueeze(1)).sum())


EVAL_TEXT = ROOT / "crates" / "pagoda-compress" / "data" / "eval_text.txt"
SMOLLM2_OUT = ROOT / "tests" / "golden" / "eval_smollm2.json"


def smollm2(gguf: Path) -> None:
    """Strided perplexity of the real SmolLM2 GGUF (dequantized by transformers)."""
    import tempfile

    full = EVAL_TEXT.read_text(encoding="utf-8")
    text = full[: full.index("On Baking Bread at Home")].rstrip()
    with tempfile.TemporaryDirectory() as d:
        # transformers wants a folder and a file name inside it.
        link = Path(d) / "model.gguf"
        link.symlink_to(gguf.resolve())
        tok = AutoTokenizer.from_pretrained(d, gguf_file="model.gguf")
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file="model.gguf", dtype=torch.float32).eval()
    ids = tok(text, add_special_tokens=True)["input_ids"]
    result = strided_perplexity(model, torch.tensor(ids), 256, 128)
    golden = {
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, GGUF weights "
        "dequantized to float32; scripts/golden_eval.py smollm2",
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "text": text,
        "text_token_ids": ids,
        "perplexity": [result],
    }
    SMOLLM2_OUT.write_text(json.dumps(golden, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {SMOLLM2_OUT.relative_to(ROOT)}: {len(ids)} tokens, ppl {result['perplexity']:.4f}")


def main() -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        FOLDER, attn_implementation="eager", dtype=torch.float32
    ).eval()
    tok = AutoTokenizer.from_pretrained(FOLDER)
    ids = tok(TEXT, add_special_tokens=True)["input_ids"]
    assert ids[0] == tok.bos_token_id, "the tiny llama's tokenizer adds BOS"
    ids_t = torch.tensor(ids)
    perplexity = [strided_perplexity(model, ids_t, c, s) for c, s in WINDOWS]

    questions = []
    for q in QUESTIONS:
        lls, ctx_ids, cont_ids = [], None, []
        for choice in q["choices"]:
            ctx, cont = encode_pair(tok, q["context"], choice)
            assert cont, (q, choice)
            ctx_ids = ctx
            cont_ids.append(cont)
            lls.append(choice_loglikelihood(model, ctx, cont))
        lens = [len(c.encode("utf-8")) for c in q["choices"]]
        questions.append(
            {
                **q,
                "context_ids": ctx_ids,
                "continuation_ids": cont_ids,
                "loglikelihoods": lls,
                "choice_bytes": lens,
                "pred": int(np.argmax(lls)),
                "pred_norm": int(np.argmax(np.array(lls) / np.array(lens, dtype=np.float64))),
            }
        )
    n = len(questions)
    acc = sum(q["pred"] == q["gold"] for q in questions) / n
    acc_norm = sum(q["pred_norm"] == q["gold"] for q in questions) / n

    golden = {
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, "
        "eager attention; scripts/golden_eval.py",
        "model": "tests/golden/tiny-llama",
        "text": TEXT,
        "text_token_ids": ids,
        "perplexity": perplexity,
        "multiple_choice": {"questions": questions, "acc": acc, "acc_norm": acc_norm},
    }
    OUT.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes)")
    for p in perplexity:
        print(f"ctx {p['ctx']:>3} stride {p['stride']:>3}: {p['windows']} windows, ppl {p['perplexity']:.4f}")
    print(f"mc: acc {acc:.3f} acc_norm {acc_norm:.3f}")


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "smollm2":
        smollm2(Path(sys.argv[2]))
    elif len(sys.argv) == 1:
        main()
    else:
        raise SystemExit("usage: golden_eval.py [smollm2 PATH.gguf]")
