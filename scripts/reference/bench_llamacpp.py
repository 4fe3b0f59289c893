#!/usr/bin/env python3
"""Peer benchmark: llama.cpp (llama-cpp-python) prefill and decode speed on one GGUF model.

    $PY scripts/reference/bench_llamacpp.py MODEL.gguf --threads 2 --prompt-tokens 512 \
        --gen-tokens 128 --repeat 3

Prints ONE JSON line on stdout (everything else goes to stderr):
  {"engine":"llama.cpp","version":...,"model":...,"threads":N,"load_s":...,"prefill_tokens":512,
   "prefill_tps":...,"decode_tokens":128,"decode_tps":...,"peak_rss_mb":...,...}

The prompt (the Rust side must use the same one, see docs/reference.md):
  text   = the contents of tests/golden/bench_prompt.txt (UTF-8), repeated 16 times, joined by "\n\n"
  tokens = the model's tokenizer on that text, with BOS if and only if the model adds it
           (llama.cpp: tokenize(text, add_bos=True, special=False), which honours the GGUF's
           tokenizer.ggml.add_bos_token), then truncated to the first --prompt-tokens tokens.
Prefill = one forward pass over those tokens from an empty KV cache (n_batch = n_ubatch = the
prompt length), timed from the first llama_decode call to its return. Decode = greedy (argmax of
the last logits) for --gen-tokens tokens after the prefill, one token per llama_decode, EOS is not
a stop (the argmax is fed back whatever it is); timed over the decode steps only. Each repeat
starts from an empty cache; the best (fastest) of --repeat is reported for each phase.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import sys
import time
from pathlib import Path

PROMPT_FILE = Path(__file__).resolve().parents[2] / "tests" / "golden" / "bench_prompt.txt"
PROMPT_REPEATS = 16


def bench_prompt_text() -> str:
    para = PROMPT_FILE.read_text(encoding="utf-8").strip()
    return "\n\n".join([para] * PROMPT_REPEATS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--verbose", action="store_true", help="llama.cpp logs on stderr")
    ap.add_argument(
        "--prompt-tokens-file",
        help="JSON list of prompt token ids to use instead of tokenizing bench_prompt.txt "
        "(`pagoda bench model` passes its own, so both engines see the same ids)",
    )
    ap.add_argument(
        "--omp-wait-policy",
        choices=["passive", "active", "env"],
        default="passive",
        help="OMP_WAIT_POLICY for llama.cpp's OpenMP threads (default passive; 'env' leaves the "
        "environment alone). On this shared 2-core machine spinning threads collapse llama.cpp's "
        "multi-threaded speed (SmolLM2 decode 4.5 tok/s spinning vs 43 passive at load ~6), so "
        "the peer gets its best setting.",
    )
    args = ap.parse_args()
    # must be set before libgomp is loaded, i.e. before importing llama_cpp
    if args.omp_wait_policy != "env":
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()

    import numpy as np
    import llama_cpp
    from llama_cpp import Llama

    n_ctx = args.prompt_tokens + args.gen_tokens + 16
    n_batch = max(args.prompt_tokens, 1)
    t0 = time.perf_counter()
    m = Llama(
        args.model,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        verbose=args.verbose,
    )
    load_s = time.perf_counter() - t0

    if args.prompt_tokens_file:
        tokens = json.loads(Path(args.prompt_tokens_file).read_text())
    else:
        tokens = m.tokenize(bench_prompt_text().encode("utf-8"), add_bos=True, special=False)
    if len(tokens) < args.prompt_tokens:
        raise SystemExit(f"bench prompt has only {len(tokens)} tokens")
    tokens = tokens[: args.prompt_tokens]
    n_vocab = m.n_vocab()
    ctx = m._ctx.ctx

    def last_argmax() -> int:
        ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
        row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
        return int(row.argmax())

    best_prefill = float("inf")
    best_decode = float("inf")
    generated: list[int] = []
    for r in range(args.repeat):
        m.reset()  # n_tokens = 0; eval() then drops the KV cache from position 0 on
        t0 = time.perf_counter()
        m.eval(tokens)
        tp = time.perf_counter() - t0
        tok = last_argmax()
        gen = [tok]
        t0 = time.perf_counter()
        for _ in range(args.gen_tokens):
            m.eval([tok])
            tok = last_argmax()
            gen.append(tok)
        td = time.perf_counter() - t0
        best_prefill = min(best_prefill, tp)
        best_decode = min(best_decode, td)
        if r == 0:
            generated = gen
        elif gen != generated:
            print(f"warning: repeat {r} generated different tokens", file=sys.stderr)
        print(
            f"repeat {r}: prefill {args.prompt_tokens / tp:.1f} tok/s, decode {args.gen_tokens / td:.2f} tok/s",
            file=sys.stderr,
        )

    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    out = {
        "engine": "llama.cpp",
        "version": f"llama-cpp-python {llama_cpp.__version__}",
        "model": os.path.basename(args.model),
        "threads": args.threads,
        "load_s": round(load_s, 3),
        "prefill_tokens": args.prompt_tokens,
        "prefill_tps": round(args.prompt_tokens / best_prefill, 2),
        "decode_tokens": args.gen_tokens,
        "decode_tps": round(args.gen_tokens / best_decode, 2),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "repeat": args.repeat,
        "prompt_head_ids": tokens[:8],
        "generated_head_ids": generated[:8],
        # the machine is shared: a 1-minute load average above the thread count means the
        # figures are lower bounds
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
    }
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
