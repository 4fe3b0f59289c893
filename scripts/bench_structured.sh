#!/usr/bin/env bash
# What a json_schema constraint costs: `pagoda bench serve` on one `pagoda serve`, the same
# chat prompts with and without `response_format`, at 1 and at 16 requests in flight. The
# two sides alternate run by run (the order flips each round), so minute-to-minute drift of
# the machine falls on both; prints each run and the medians' ratios (docs/benchmarks.md
# records the output).
#
#   scripts/bench_structured.sh [MODEL] [ROUNDS]
#
# MODEL: a store name (default smollm2:135m); ROUNDS (default 3).
# Environment: PAGODA (default target/release/pagoda), THREADS (default 2), MAX_TOKENS (128).
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-smollm2:135m}"
rounds="${2:-3}"
pagoda="${PAGODA:-target/release/pagoda}"
threads="${THREADS:-2}"
max_tokens="${MAX_TOKENS:-128}"
out="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

source scripts/lib/servers.sh
require_pagoda "$pagoda"

# The same 32 prompts twice: free, and constrained by a person schema (the one
# scripts/conformance/tools.py validates).
python3 - "$out" "$max_tokens" <<'EOF'
import json, sys
out, max_tokens = sys.argv[1], int(sys.argv[2])
schema = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "job", "hobbies", "retired"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "job": {"type": "string", "enum": ["engineer", "teacher", "doctor", "artist", "farmer"]},
                         "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3},
                         "retired": {"type": "boolean"}}}
fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
places = ["Lisbon", "Nairobi", "Osaka", "Lima", "Oslo", "Cairo", "Hanoi", "Quito"]
traits = ["young", "old", "cheerful", "quiet"]
prompts = [f"Invent a {t} person from {p}. Answer with JSON only: name, age, job, hobbies, retired."
           for p in places for t in traits]
for name, extra in (("free", {}), ("json_schema", {"response_format": fmt})):
    with open(f"{out}/{name}.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps({"messages": [{"role": "user", "content": p}], "max_tokens": max_tokens, **extra}) + "\n")
EOF

RAYON_NUM_THREADS="$threads" "$pagoda" serve --model "$model" --port 18445 --threads "$threads" \
  --max-num-seqs 16 --kv-cache-memory 1GiB 2>"$out/serve.log" &
wait_ready http://127.0.0.1:18445

run() { # side concurrency round
  local n=$(( $2 == 1 ? 8 : 32 ))
  "$pagoda" bench serve --url http://127.0.0.1:18445 --model "$model" --dataset "$out/$1.jsonl" \
    --concurrency "$2" --num-requests "$n" --warmup 2 --temperature 0 \
    --json "$out/$1-c$2-r$3.json" >/dev/null 2>&1
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print(f\"$1 c=$2 round $3: {s['output_tokens_per_s']:.1f} out tok/s, TPOT mean {s['tpot_ms']['mean']:.1f} ms, {s['output_tokens']} tokens, {s['errors']} errors\")" "$out/$1-c$2-r$3.json"
}

for r in $(seq "$rounds"); do
  for c in 1 16; do
    if (( r % 2 )); then run free "$c" "$r"; run json_schema "$c" "$r"
    else run json_schema "$c" "$r"; run free "$c" "$r"; fi
  done
done

python3 - "$out" "$rounds" "$model" <<'EOF'
import json, statistics, sys
out, rounds, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def med(side, c, key):
    vals = []
    for r in range(1, rounds + 1):
        s = json.load(open(f"{out}/{side}-c{c}-r{r}.json"))["summary"]
        vals.append(s["output_tokens_per_s"] if key == "tps" else s["tpot_ms"]["mean"])
    return statistics.median(vals)
print(f"\n{model}, median of {rounds} rounds (json_schema / free):")
print("| in flight | free out tok/s | json_schema out tok/s | ratio | free TPOT ms | json_schema TPOT ms | ratio |")
print("|---|---|---|---|---|---|---|")
for c in (1, 16):
    ft, jt = med("free", c, "tps"), med("json_schema", c, "tps")
    fp, jp = med("free", c, "tpot"), med("json_schema", c, "tpot")
    print(f"| {c} | {ft:.1f} | {jt:.1f} | {jt / ft:.3f}x | {fp:.1f} | {jp:.1f} | {jp / fp:.3f}x |")
EOF
