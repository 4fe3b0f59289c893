#!/usr/bin/env bash
# Greedy output with speculative decoding equals greedy output without it, on a real target
# and draft pair, over the code-editing and chat prompt sets (scripts/data/spec_*.jsonl), all
# prompts in one continuously batched job (`pagoda batch`): plain, n-gram lookup, draft model.
# Prints per prompt whether the three texts are identical, and exits non-zero if any differ.
#
#   scripts/check_speculative_greedy.sh [TARGET] [DRAFT]     (defaults: qwen2.5-coder:1.5b/0.5b)
#
# Environment: PAGODA (default target/release/pagoda), MAX_TOKENS (128), THREADS (2), SEQS (16:
# sequences per step; 1 = one request at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-qwen2.5-coder:1.5b}"
draft="${2:-qwen2.5-coder:0.5b}"
pagoda="${PAGODA:-target/release/pagoda}"
max_tokens="${MAX_TOKENS:-128}"
threads="${THREADS:-2}"
out="$(mktemp -d)"

python3 - "$out/in.jsonl" "$max_tokens" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for name in ("code_edit", "chat"):
        for i, line in enumerate(open(f"scripts/data/spec_{name}.jsonl")):
            body = json.loads(line)
            body.update(temperature=0, max_tokens=int(sys.argv[2]))
            f.write(json.dumps({"custom_id": f"{name}-{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n")
PY
run() { # name extra-args...
  local name="$1"; shift
  local t0=$SECONDS
  "$pagoda" batch "$out/in.jsonl" -o "$out/$name.jsonl" --model "$target" --threads "$threads" \
    --max-num-seqs "${SEQS:-16}" "$@" 2>"$out/$name.log"
  echo "$name: $((SECONDS - t0)) s"
}
run plain
run ngram --speculative ngram
run draft --draft-model "$draft"
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def texts(name):
    rows = {}
    for line in open(os.path.join(out, f"{name}.jsonl")):
        r = json.loads(line)
        body = r["response"]["body"]
        rows[r["custom_id"]] = body["choices"][0]["message"]["content"]
    return rows
plain, ngram, draft = texts("plain"), texts("ngram"), texts("draft")
bad = 0
for cid in plain:
    same = plain[cid] == ngram[cid] == draft[cid]
    bad += not same
    print(f"{cid:<12} {'identical' if same else 'DIFFERENT'}  ({len(plain[cid])} chars)")
    if not same:
        for name, t in (("plain", plain), ("ngram", ngram), ("draft", draft)):
            print(f"  {name}: {t[cid][:300]!r}")
print(f"{len(plain) - bad}/{len(plain)} prompts identical")
sys.exit(1 if bad else 0)
PY
