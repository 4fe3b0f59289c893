#!/usr/bin/env bash
# Speculative decoding, single stream: Pagoda and llama.cpp's llama-server on the same target
# and draft GGUFs, the same threads and prompts, in one run. For each server: plain decoding,
# n-gram prompt lookup, and the draft model; for each, a code-editing and a chat prompt set
# (scripts/data/spec_{code_edit,chat}.jsonl), greedy, one request at a time. Prints one line
# per run (output tokens/s, TTFT, TPOT) and the speedups over plain decoding, in output
# tokens/s (prefill included) and in decode tokens/s (1000 / TPOT)
# (docs/benchmarks.md records the output).
#
#   scripts/bench_speculative.sh [TARGET] [DRAFT]
#
# TARGET default qwen2.5-coder:1.5b, DRAFT default qwen2.5-coder:0.5b (store names).
# Environment: PAGODA (default target/release/pagoda), LLAMA_SERVER (default
# ~/.cache/pagoda/peer/bin/llama-server, built by scripts/reference/build_llama_server.sh),
# THREADS (2), MAX_TOKENS (128), REQUESTS (per set, default 8 = the whole set), K (7: most
# tokens proposed per step, both servers), SKIP_LLAMA=1 (Pagoda only).
set -euo pipefail
cd "$(dirname "$0")/.."

target="${1:-qwen2.5-coder:1.5b}"
draft="${2:-qwen2.5-coder:0.5b}"
pagoda="${PAGODA:-target/release/pagoda}"
llama="${LLAMA_SERVER:-$HOME/.cache/pagoda/peer/bin/llama-server}"
threads="${THREADS:-2}"
max_tokens="${MAX_TOKENS:-128}"
requests="${REQUESTS:-8}"
k="${K:-7}"
out="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

source scripts/lib/servers.sh
require_pagoda "$pagoda"
target_gguf="$("$pagoda" show --path "$target")"
draft_gguf="$("$pagoda" show --path "$draft")"


bench_sets() { # name url
  for set in code_edit chat; do
    "$pagoda" bench serve --url "$2" --model "$target" --dataset "scripts/data/spec_$set.jsonl" \
      --max-tokens "$max_tokens" --temperature 0 --concurrency 1 --num-requests "$requests" \
      --warmup 1 --json "$out/$1-$set.json" >"$out/$1-$set.txt" 2>&1 \
      || { cat "$out/$1-$set.txt" >&2; return 1; }
    python3 - "$out/$1-$set.json" "$1" "$set" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
def pick(*names):
    for n in names:
        v = s
        for part in n.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None:
            return v
    return float("nan")
tps = pick("output_tokens_per_s", "output_throughput")
ttft = pick("ttft_ms.mean", "ttft.mean_ms")
tpot = pick("tpot_ms.mean", "tpot.mean_ms")
print(f"{sys.argv[2]:<16} {sys.argv[3]:<10} {tps:8.2f} tok/s  TTFT {ttft:8.1f} ms  TPOT {tpot:7.1f} ms")
PY
  done
}

run_pagoda() { # name extra-args...
  local name="$1"; shift
  RAYON_NUM_THREADS="$threads" "$pagoda" serve --model "$target" --port 18445 \
    --threads "$threads" --max-num-seqs 4 --max-model-len 2048 "$@" 2>"$out/$name.log" &
  local pid=$!
  wait_ready http://127.0.0.1:18445
  bench_sets "$name" http://127.0.0.1:18445
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

run_llama() { # name extra-args...
  local name="$1"; shift
  "$llama" -m "$target_gguf" -t "$threads" -tb "$threads" -c 2048 --parallel 1 \
    --host 127.0.0.1 --port 18446 "$@" >"$out/$name.log" 2>&1 &
  local pid=$!
  wait_ready http://127.0.0.1:18446
  bench_sets "$name" http://127.0.0.1:18446
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

echo "target $target ($target_gguf), draft $draft; $threads threads, $max_tokens tokens, $requests requests per set, k <= $k"
run_pagoda pagoda-plain
run_pagoda pagoda-ngram --speculative ngram --num-speculative-tokens "$k"
run_pagoda pagoda-draft --draft-model "$draft_gguf" --num-speculative-tokens "$k"
if [[ -z "${SKIP_LLAMA:-}" ]]; then
  require_llama_server "$llama"
  run_llama llama-plain
  run_llama llama-ngram --spec-type ngram-simple --spec-draft-n-max "$k"
  run_llama llama-draft -md "$draft_gguf" -td "$threads" --spec-draft-n-max "$k"
fi

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def tps(name, s):
    p = os.path.join(out, f"{name}-{s}.json")
    if not os.path.exists(p):
        return None
    d = json.load(open(p))["summary"]
    return d.get("output_tokens_per_s") or d.get("output_throughput")
def decode_tps(name, s):
    """Single-stream decode tokens/s: 1000 / TPOT (prefill excluded)."""
    p = os.path.join(out, f"{name}-{s}.json")
    if not os.path.exists(p):
        return None
    d = json.load(open(p))["summary"]
    tpot = (d.get("tpot_ms") or {}).get("mean") or (d.get("tpot") or {}).get("mean_ms")
    return 1000.0 / tpot if tpot else None
for label, rate in (("output tokens/s, prefill included", tps), ("decode tokens/s = 1000 / TPOT", decode_tps)):
    print(f"\nspeedup over the same server's plain decoding ({label}):")
    for server in ("pagoda", "llama"):
        for s in ("code_edit", "chat"):
            base = rate(f"{server}-plain", s)
            if not base:
                continue
            row = [f"{server:<7} {s:<10}"]
            for m in ("ngram", "draft"):
                v = rate(f"{server}-{m}", s)
                row.append(f"{m} {v / base:5.2f}x" if v else f"{m}   -  ")
            print("  ".join(row))
print("\nPagoda / llama.cpp (output tokens/s):")
for m in ("plain", "ngram", "draft"):
    for s in ("code_edit", "chat"):
        a, b = tps(f"pagoda-{m}", s), tps(f"llama-{m}", s)
        if a and b:
            print(f"{m:<6} {s:<10} {a / b:5.2f}x")
PY
