#!/usr/bin/env python3
"""The teacher's continuations of a prompts file through a running `pagoda serve` (continuous
batching), written as `pagoda distill --data` lines {"text": prompt + continuation}.

Usage: teacher_generations.py --url http://127.0.0.1:18089 --model qwen2.5-coder:1.5b \\
         --prompts prompts.jsonl --out gen1.jsonl [--seed 1000] [--max-tokens 240]
(`pagoda distill --prompts` does the same inside the distillation, 8 prompts per batch.)
"""
import argparse
import concurrent.futures as cf
import json
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1000, help="request i uses seed + i")
    ap.add_argument("--max-tokens", type=int, default=240)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--concurrency", type=int, default=12)
    args = ap.parse_args()
    prompts = [json.loads(line)["text"] for line in open(args.prompts)]

    def one(i):
        body = {"model": args.model, "prompt": prompts[i], "max_tokens": args.max_tokens,
                "temperature": args.temperature, "top_p": args.top_p, "seed": args.seed + i}
        req = urllib.request.Request(args.url + "/v1/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
        d = json.load(urllib.request.urlopen(req, timeout=3600))
        return prompts[i] + d["choices"][0]["text"], d["usage"]["completion_tokens"]

    t0, tokens = time.time(), 0
    with cf.ThreadPoolExecutor(args.concurrency) as ex, open(args.out, "w") as out:
        for n, (text, used) in enumerate(ex.map(one, range(len(prompts))), 1):
            out.write(json.dumps({"text": text}) + "\n")
            tokens += used
            if n % args.concurrency == 0:
                print(f"{n}/{len(prompts)} done, {tokens} tokens, {tokens / (time.time() - t0):.1f} tok/s",
                      flush=True)
    print(f"wrote {args.out}: {tokens} tokens in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
