#!/usr/bin/env python3
"""Prefix-aware routing against round robin and least outstanding (issue 25's benchmark).

Starts REPLICAS `pagoda serve` processes of one model and one `pagoda gateway` in front of
them, and runs `pagoda bench serve` through the gateway on two workloads:

  shared     multi-turn conversations under a few long system prompts: each request carries
             its conversation so far (the shape of chat traffic), so most of every prompt is
             a prefix some replica has seen;
  unrelated  prompts of the same lengths that share nothing.

For every (workload, policy) the replicas and the gateway are started fresh (empty prefix
caches), and the policies are alternated run by run (this VM drifts), ROUNDS times. Prints
mean and p99 TTFT and output tokens/s per run and the median per policy, and the ratio of
round robin's and least outstanding's mean TTFT to prefix-aware's.

    python3 scripts/bench_prefix_routing.py --pagoda target/release/pagoda --model smollm2:135m

The defaults are the measurement in docs/benchmarks.md ("Prefix-aware routing"): 9 system
prompts of ~1,300 tokens, 27 conversations of 4 turns arriving in random order, each
replica's KV pool 160 MiB (about a third of what is live).

Needs the model in the store ($PAGODA_HOME). Writes nothing but a temporary folder and, with
--json, the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

POLICIES = ["round_robin", "least_outstanding", "prefix"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url: str, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f} s")


def words(rng: random.Random, n: int) -> str:
    vocab = ("river stone lantern harbour orchard meadow engine ledger compass window "
             "garden signal bridge winter market candle thread anchor valley letter").split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def shared_workload(rng: random.Random, systems: int, conversations: int, turns: int,
                    system_words: int, order: str) -> list[dict]:
    """Conversations under `systems` system prompts; turn k carries turns 1..k.

    `order` is how the conversations' turns interleave. `random` (the default): each next
    request is the next turn of a conversation drawn at random among those with turns left,
    as independent users produce them. `rotation`: turn 1 of every conversation, then turn 2
    of every one, ... — a fixed period of `conversations` requests, which round robin over
    replicas that divide it turns into perfect conversation affinity (an artefact of the
    benchmark, kept to reproduce the first measurements)."""
    prompts = [f"You are assistant {i}. " + words(rng, system_words) for i in range(systems)]
    convs = [[{"role": "system", "content": prompts[c % systems]}]
             for c in range(conversations)]
    if order == "rotation":
        schedule = [c for _ in range(turns) for c in range(conversations)]
    else:
        left = {c: turns for c in range(conversations)}
        schedule = []
        while left:
            c = rng.choice(sorted(left))
            schedule.append(c)
            left[c] -= 1
            if left[c] == 0:
                del left[c]
    lines = []
    for c in schedule:  # a conversation's turns always come in order
        msgs = convs[c]
        t = (len(msgs) - 1) // 2
        msgs.append({"role": "user", "content": f"Question {t}: " + words(rng, 12)})
        lines.append({"messages": [dict(m) for m in msgs]})
        msgs.append({"role": "assistant", "content": words(rng, 24)})
    return lines


def unrelated_workload(rng: random.Random, like: list[dict]) -> list[dict]:
    """As many requests, each a single message of the same character length, sharing nothing."""
    out = []
    for line in like:
        n = sum(len(m["content"]) for m in line["messages"])
        text = f"{rng.random():.12f} " + words(rng, n // 6 + 1)
        out.append({"messages": [{"role": "user", "content": text[:n]}]})
    return out


class Cluster:
    """REPLICAS servers and a gateway with `balance = POLICY`."""

    def __init__(self, pagoda: str, gateway: str, model: str, replicas: int, threads: int,
                 policy: str, work: Path, server_args: list[str], prefix_slack: int | None):
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        urls = []
        for i in range(replicas):
            port = free_port()
            log = open(work / f"server-{policy}-{i}.log", "w")
            self.logs.append(log)
            self.procs.append(subprocess.Popen(
                [pagoda, "serve", "--model", model, "--port", str(port),
                 "--threads", str(threads), *server_args],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            urls.append(f"http://127.0.0.1:{port}")
        for u in urls:
            wait_ok(u + "/ready")
        gport = free_port()
        config = work / f"gateway-{policy}.toml"
        config.write_text(
            f'[server]\nlisten = "127.0.0.1:{gport}"\n'
            f'[storage]\nsqlite = "{work}/gw-{policy}.sqlite"\n'
            "[health]\ninterval_ms = 0\n"
            f'[[target]]\nname = "m"\nmodel = "{model}"\nreplicas = {json.dumps(urls)}\n'
            f'[[route]]\nmodel = "chat"\ntarget = "m"\nbalance = "{policy}"\n'
            + (f"prefix_load_slack = {prefix_slack}\n"
               if policy == "prefix" and prefix_slack is not None else "") +
            f'[[key]]\nname = "bench"\nkey_sha256 = "{key_hash()}"\n')
        log = open(work / f"gateway-{policy}.log", "w")
        self.logs.append(log)
        self.procs.append(subprocess.Popen(
            [gateway, "gateway", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        self.url = f"http://127.0.0.1:{gport}"
        self.replica_urls = urls
        wait_ok(self.url + "/health")

    def replica_stats(self) -> dict:
        """Per replica, from its /metrics: requests answered, prompt tokens, and prompt tokens
        its prefix cache held (what the routing policy is meant to raise)."""
        per = []
        for u in self.replica_urls:
            with urllib.request.urlopen(u + "/metrics", timeout=10) as r:
                text = r.read().decode()
            per.append({name: metric_sum(text, f"pagoda:{name}")
                        for name in ("request_success_total", "prompt_tokens_total",
                                     "prefix_cache_queries_total", "prefix_cache_hits_total")})
        queries = sum(p["prefix_cache_queries_total"] for p in per)
        hits = sum(p["prefix_cache_hits_total"] for p in per)
        return {"requests_per_replica": [int(p["request_success_total"]) for p in per],
                "prefix_hit_rate": hits / queries if queries else 0.0,
                "prompt_tokens_computed": int(queries - hits)}

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for log in self.logs:
            log.close()


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of the Prometheus metric `name` in an exposition `text`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


KEY = "pk-bench-prefix-routing"


def key_hash() -> str:
    import hashlib
    return "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()


def run_bench(pagoda: str, url: str, dataset: Path, args, out: Path) -> dict:
    cmd = [pagoda, "bench", "serve", "--url", url, "--model", "chat", "--api-key", KEY,
           "--dataset", str(dataset), "--concurrency", str(args.concurrency),
           "--max-tokens", str(args.max_tokens), "--num-requests", str(args.requests),
           "--json", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    s = json.loads(out.read_text())["summary"]
    if s.get("errors"):
        raise RuntimeError(f"{s['errors']} requests failed: {out}")
    return {"ttft_mean_ms": s["ttft_ms"]["mean"], "ttft_p99_ms": s["ttft_ms"]["p99"],
            "output_tok_s": s["output_tokens_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pagoda", required=True)
    ap.add_argument("--gateway-pagoda", help="the pagoda binary that runs the gateway and the "
                    "load generator (default: --pagoda)")
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads per replica")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--systems", type=int, default=9, help="distinct system prompts")
    ap.add_argument("--conversations", type=int, default=27)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=1200,
                    help="words per system prompt (~1,300 tokens at 1,200: an agent's "
                    "instructions and tool definitions)")
    ap.add_argument("--order", choices=["random", "rotation"], default="random",
                    help="how conversations' turns interleave (see shared_workload)")
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="comma-separated, run in this order (reversed every other round); a "
                    "policy may repeat, to see the drift between two runs of one policy")
    ap.add_argument("--workloads", default="shared,unrelated")
    ap.add_argument("--kv-cache-memory", default="160MiB",
                    help="each replica's KV pool: the default holds about a third of the shared "
                    "workload's live prefixes plus the running requests (the regime of a "
                    "loaded GPU server); a pool that holds them all lets every policy hit")
    ap.add_argument("--server-args", default="", help="more `pagoda serve` options")
    ap.add_argument("--prefix-load-slack", type=int,
                    help="the prefix route's prefix_load_slack (default: the gateway's)")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    pagoda = str(Path(args.pagoda).resolve())
    gateway = str(Path(args.gateway_pagoda or args.pagoda).resolve())
    policies = args.policies.split(",")
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        ap.error(f"--policies: unknown {unknown}; choose among {POLICIES}")
    workloads = args.workloads.split(",")
    if not workloads or set(workloads) - {"shared", "unrelated"}:
        ap.error(f"--workloads: {args.workloads!r}; give shared, unrelated or both")
    rng = random.Random(1)
    shared = shared_workload(rng, args.systems, args.conversations, args.turns,
                             args.system_words, args.order)
    unrelated = unrelated_workload(rng, shared)
    args.requests = len(shared)
    runs = []
    with tempfile.TemporaryDirectory(prefix="pagoda-prefix-bench-") as tmp:
        work = Path(tmp)
        data = {}
        for name, lines in [("shared", shared), ("unrelated", unrelated)]:
            data[name] = work / f"{name}.jsonl"
            data[name].write_text("".join(json.dumps(l) + "\n" for l in lines))
        for rnd in range(args.rounds):
            for workload in workloads:
                order = policies if rnd % 2 == 0 else list(reversed(policies))
                for policy in order:
                    cluster = Cluster(pagoda, gateway, args.model, args.replicas, args.threads,
                                      policy, work,
                                      ["--kv-cache-memory", args.kv_cache_memory,
                                       *shlex.split(args.server_args)],
                                      args.prefix_load_slack)
                    try:
                        fig = run_bench(gateway, cluster.url, data[workload], args,
                                        work / f"{workload}-{policy}-{rnd}.json")
                        fig.update(cluster.replica_stats())
                    finally:
                        cluster.stop()
                    fig.update(round=rnd, workload=workload, policy=policy)
                    runs.append(fig)
                    print(f"round {rnd} {workload:9} {policy:17} TTFT mean "
                          f"{fig['ttft_mean_ms']:8.1f} ms  p99 {fig['ttft_p99_ms']:8.1f} ms  "
                          f"output {fig['output_tok_s']:6.1f} tok/s  prefix hits "
                          f"{fig['prefix_hit_rate']:5.1%}  computed "
                          f"{fig['prompt_tokens_computed']:6d}  per replica "
                          f"{fig['requests_per_replica']}", flush=True)
    print("\n| workload | policy | mean TTFT ms | p99 TTFT ms | output tok/s | prefix hits |")
    print("|---|---|---|---|---|---|")
    med = {}
    for workload in workloads:
        for policy in dict.fromkeys(policies):
            rs = [r for r in runs if r["workload"] == workload and r["policy"] == policy]
            m = {k: statistics.median(r[k] for r in rs)
                 for k in ("ttft_mean_ms", "ttft_p99_ms", "output_tok_s", "prefix_hit_rate")}
            med[(workload, policy)] = m
            print(f"| {workload} | {policy} | {m['ttft_mean_ms']:.1f} | {m['ttft_p99_ms']:.1f} "
                  f"| {m['output_tok_s']:.1f} | {m['prefix_hit_rate']:.0%} |")
    if "prefix" in policies:
        for workload in workloads:
            p = med[(workload, "prefix")]["ttft_mean_ms"]
            for other in [x for x in dict.fromkeys(policies) if x != "prefix"]:
                o = med[(workload, other)]["ttft_mean_ms"]
                print(f"{workload}: mean TTFT {other} / prefix = {o / p:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
