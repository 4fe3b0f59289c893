#!/usr/bin/env bash
# `pagoda bench serve` against `pagoda serve` and against llama.cpp's `llama-server`, on the
# same GGUF file, the same threads, the same workload, in one run; prints both tables and the
# ratios (docs/benchmarks.md records the output).
#
#   scripts/bench_serve_peer.sh [MODEL] [CONCURRENCY] [REQUESTS]
#
# MODEL: a store name (default smollm2:135m); CONCURRENCY (default 4): requests in flight, and
# llama-server's --parallel slots and Pagoda's --max-num-seqs; REQUESTS (default 32).
# Environment: PAGODA (default target/release/pagoda), LLAMA_SERVER (default
# ~/.cache/pagoda/peer/bin/llama-server, built by scripts/reference/build_llama_server.sh),
# THREADS (default 2), INPUT_LEN (256), MAX_TOKENS (128), CTX (per slot, 1024).
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-smollm2:135m}"
conc="${2:-4}"
requests="${3:-32}"
pagoda="${PAGODA:-target/release/pagoda}"
llama="${LLAMA_SERVER:-$HOME/.cache/pagoda/peer/bin/llama-server}"
threads="${THREADS:-2}"
input_len="${INPUT_LEN:-256}"
max_tokens="${MAX_TOKENS:-128}"
ctx="${CTX:-1024}"
out="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

source scripts/lib/servers.sh
require_pagoda "$pagoda"
require_llama_server "$llama"
gguf="$("$pagoda" show --path "$model")"


bench() { # name url
  echo "== $1"
  "$pagoda" bench serve --url "$2" --model "$model" --dataset random --input-len "$input_len" \
    --max-tokens "$max_tokens" --concurrency "$conc" --num-requests "$requests" --warmup 2 \
    --seed 1 --json "$out/$1.json" --plot "$out/$1.svg"
}

# Pagoda: the batching engine with as many sequences as the load generator keeps in flight.
RAYON_NUM_THREADS="$threads" "$pagoda" serve --model "$gguf" --port 18435 --threads "$threads" \
  --max-num-seqs "$conc" --max-model-len "$ctx" 2>"$out/pagoda.log" &
pagoda_pid=$!
wait_ready http://127.0.0.1:18435
bench pagoda http://127.0.0.1:18435
kill "$pagoda_pid"; wait "$pagoda_pid" 2>/dev/null || true

# llama-server: continuous batching over CONCURRENCY slots of CTX tokens each.
"$llama" -m "$gguf" -t "$threads" -tb "$threads" -c $((ctx * conc)) --parallel "$conc" -cb \
  --host 127.0.0.1 --port 18436 -b 512 -ub 512 >"$out/llama.log" 2>&1 &
llama_pid=$!
wait_ready http://127.0.0.1:18436
bench llama-server http://127.0.0.1:18436
kill "$llama_pid"; wait "$llama_pid" 2>/dev/null || true

python3 - "$out/pagoda.json" "$out/llama-server.json" <<'EOF'
import json, sys
p, l = (json.load(open(f))["summary"] for f in sys.argv[1:3])
def ratio(a, b):
    return a / b if b else float("nan")
print("== pagoda / llama-server")
print(f"output tokens/s: {p['output_tokens_per_s']:.1f} / {l['output_tokens_per_s']:.1f} = {ratio(p['output_tokens_per_s'], l['output_tokens_per_s']):.2f}x")
print(f"request throughput: {p['request_throughput']:.3f} / {l['request_throughput']:.3f} = {ratio(p['request_throughput'], l['request_throughput']):.2f}x")
for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
    print(f"{k} p50: {p[k]['p50']:.1f} / {l[k]['p50']:.1f} ms = {ratio(p[k]['p50'], l[k]['p50']):.2f}x; "
          f"p99: {p[k]['p99']:.1f} / {l[k]['p99']:.1f} ms = {ratio(p[k]['p99'], l[k]['p99']):.2f}x")
EOF
echo "reports and charts: $out"
