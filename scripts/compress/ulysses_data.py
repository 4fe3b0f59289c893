#!/usr/bin/env python3
"""General-prose distillation data: 240 passages of ~1,100 characters spread evenly over James
Joyce's Ulysses (public domain), which the llguidance crate ships as test data (so it is in
the cargo registry of any machine that built Pagoda). Writes ulysses.jsonl."""
import glob, json, os, re
home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
path = sorted(glob.glob(f"{home}/registry/src/*/llguidance-*/tests/data/ulysses.md"))[-1]
text = open(path, encoding="utf-8").read()
start = text.find("Stately, plump Buck Mulligan")
end = text.rfind("Trieste-Zurich-Paris")
paras = [p.strip() for p in re.split(r"\n\s*\n", text[start:end if end > 0 else None]) if p.strip()]
chunks, cur = [], ""
for p in paras:
    cur = f"{cur}\n\n{p}" if cur else p
    if len(cur) >= 1100:
        chunks.append(cur)
        cur = ""
step = len(chunks) / 240
picked = [chunks[int(i * step)] for i in range(240)]
with open("ulysses.jsonl", "w") as f:
    for c in picked:
        f.write(json.dumps({"text": c}) + "\n")
print(len(chunks), "chunks;", len(picked), "picked;", sum(map(len, picked)), "chars")
