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
# tokens proposed per step, both servers), ROUNDS (1: how many times every configuration runs,
# interleaved; the summary averages them), SKIP_LLAMA=1 (Pagoda only).
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
rounds="${ROUNDS:-1}"
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
[[ -z "${SKIP_LLAMA:-}" ]] && require_llama_server "$llama"
# Rounds interleave every configuration (the machine's speed drifts between minutes); the
# summary averages each configuration over its rounds.
for round in $(seq "$rounds"); do
  run_pagoda "pagoda-plain@$round"
  run_pagoda "pagoda-ngram@$round" --speculative ngram --num-speculative-tokens "$k"
  run_pagoda "pagoda-draft@$round" --draft-model "$draft_gguf" --num-speculative-tokens "$k"
  if [[ -z "${SKIP_LLAMA:-}" ]]; then
    run_llama "llama-plain@$round"
    run_llama "llama-ngram@$round" --spec-type ngram-simple --spec-draft-n-max "$k"
    run_llama "llama-draft@$round" -md "$draft_gguf" -td "$threads" --spec-draft-n-max "$k"
  fi
done

python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
def summaries(name, s):
    """The summaries of every round of configuration `name` on set `s`."""
    return [json.load(open(p))["summary"] for p in sorted(glob.glob(os.path.join(out, f"{name}@*-{s}.json")))]
def mean(values):
    values = [v for v in values if v]
    return sum(values) / len(values) if values else None
def tps(name, s):
    return mean([d.get("output_tokens_per_s") or d.get("output_throughput") for d in summaries(name, s)])
def decode_tps(name, s):
    """Single-stream decode tokens/s: 1000 / TPOT (prefill excluded), TPOT averaged over rounds."""
    tpot = mean([(d.get("tpot_ms") or {}).get("mean") or (d.get("tpot") or {}).get("mean_ms")
                 for d in summaries(name, s)])
    return 1000.0 / tpot if tpot else None
print(f"\nmeans over {len(summaries('pagoda-plain', 'code_edit'))} round(s):")
for name in ("pagoda-plain", "pagoda-ngram", "pagoda-draft", "llama-plain", "llama-ngram", "llama-draft"):
    for s in ("code_edit", "chat"):
        t, d = tps(name, s), decode_tps(name, s)
        if t and d:
            print(f"{name:<16} {s:<10} {t:8.2f} tok/s  TPOT {1000.0 / d:7.1f} ms")
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
