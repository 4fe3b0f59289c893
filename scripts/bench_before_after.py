#!/usr/bin/env python3
"""Before/after benchmark of two pagoda binaries on the same models, alternated run by run.

This VM's speed drifts by 20-40 % from minute to minute, so the two binaries never run in
separate blocks: every round runs both, swapping which goes first, and the summary is the
median over rounds of each figure and of the per-round ratio new/old.

For each model and round:
  pagoda bench model MODEL --no-peer --json  (prefill and single-stream decode tokens/s;
                                              since issue 20 this is the serving engine's loop)
  pagoda bench batching MODEL --json --modes continuous --concurrency C
                                             (output tokens/s under concurrency)

    OLD=/path/to/old/pagoda NEW=/path/to/new/pagoda \\
      scripts/bench_before_after.py smollm2:135m qwen2.5-coder:1.5b --rounds 3

docs/benchmarks.md records the output.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def model_figures(binary, model, args):
    rows = run_json([binary, "bench", "model", model, "--no-peer", "--json",
                     "--prompt-tokens", str(args.prompt_tokens),
                     "--gen-tokens", str(args.gen_tokens), "--repeat", str(args.repeat)])
    ours = rows[0]
    return {"prefill_tps": ours["prefill_tps"], "decode_tps": ours["decode_tps"]}


def batching_figures(binary, model, args):
    rows = run_json([binary, "bench", "batching", model, "--json", "--modes", "continuous",
                     "--concurrency", args.concurrency, "--requests", str(args.requests),
                     "--output-len", args.output_len])
    return {f"c{r['concurrency']}_output_tps": r["output_tps"] for r in rows}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--old", default=os.environ.get("OLD"), help="the binary before (env OLD)")
    p.add_argument("--new", default=os.environ.get("NEW"), help="the binary after (env NEW)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--output-len", default="16-64")
    p.add_argument("--skip-batching", action="store_true")
    p.add_argument("--skip-model", action="store_true",
                   help="only the batching figures (e.g. --concurrency 1 to settle one figure)")
    args = p.parse_args()
    if args.skip_model and args.skip_batching:
        p.error("--skip-model and --skip-batching leave nothing to measure")
    if not args.old or not args.new:
        p.error("give both binaries: --old/--new or OLD=/NEW=")
    for model in args.models:
        figures = {"old": [], "new": []}
        for r in range(args.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for side in order:
                binary = getattr(args, side)
                f = {} if args.skip_model else model_figures(binary, model, args)
                if not args.skip_batching:
                    f.update(batching_figures(binary, model, args))
                figures[side].append(f)
                print(f"{model} round {r + 1} {side}: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in f.items()), flush=True)
        print(f"\n{model}: median over {args.rounds} rounds (ratio = median of per-round new/old)")
        print(f"{'figure':<22}{'old':>10}{'new':>10}{'ratio':>8}")
        for key in figures["old"][0]:
            old = [f[key] for f in figures["old"]]
            new = [f[key] for f in figures["new"]]
            ratio = statistics.median(n / o for n, o in zip(new, old) if o > 0)
            print(f"{key:<22}{statistics.median(old):>10.1f}{statistics.median(new):>10.1f}"
                  f"{ratio:>8.3f}")
        print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
