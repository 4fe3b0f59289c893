#!/usr/bin/env python3
"""The figures of scripts/gpu/check.sh: what it finds on the machine, the speed targets of the
card found, and the summary it rewrites after every step.

    check_report.py devices DEVICES.json CARD.json --cards TABLE [--require-gpu]
    check_report.py speed LOGS CONFIG.json CARD.json --targets TARGETS [--enforce]
    check_report.py summary OUT LOGS --dry-run 0|1 --part P --device D --deadline S --seconds S

TABLE (check.sh's CARDS): lines `name pattern|HBM TB/s|dense bf16 TFLOP/s`, the first whose
pattern is in the GPU's name wins. TARGETS (check.sh's TARGETS): `key=fraction` pairs.

`devices` writes CARD.json: the GPU found and its roofline (null figures for a device the table
does not know: the interpreter, an unlisted card; speed is then reported, not scored).
`speed` reads LOGS/speed_*.json (`pagoda bench ... --json`) and writes LOGS/speed.json: each
figure, its roofline on this card and the target as a fraction of it; exit 1 when a target is
missed and --enforce is given, or a figure is missing.
`summary` writes OUT/summary.json from OUT/steps.tsv and what LOGS holds so far.
"""

import argparse
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def json_lines(path):
    """The JSON objects of a `--json` output, one per line (other lines ignored)."""
    rows = []
    try:
        for line in open(path):
            if line.strip().startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return rows


def parse_cards(table):
    cards = []
    for line in table.strip().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            pattern, tbs, tflops = (x.strip() for x in line.split("|"))
            cards.append((pattern, float(tbs), float(tflops)))
    return cards


def cmd_devices(args):
    report = load(args.devices)
    if report is None:
        print(f"cannot read {args.devices}")
        return 1
    for g in report.get("gpus", []):
        cc = g.get("compute_capability", [0, 0])
        print(
            f"cuda:{g['ordinal']} {g['name']} {g['memory_bytes'] / 2**30:.1f} GiB "
            f"sm_{cc[0]}{cc[1]}"
        )
    print(f"libraries: {report.get('cuda_libraries')}")
    gpu = report["gpus"][0] if report.get("gpus") else None
    card = {"gpu": gpu, "pattern": None, "hbm_tb_s": None, "bf16_dense_tflops": None}
    if gpu:
        for pattern, tbs, tflops in parse_cards(args.cards):
            if pattern in gpu["name"]:
                card.update(pattern=pattern, hbm_tb_s=tbs, bf16_dense_tflops=tflops)
                break
        print(
            f"roofline: {card['pattern'] or 'unknown card (speed reported, not scored)'}"
            + (f", {card['hbm_tb_s']} TB/s, {card['bf16_dense_tflops']} TFLOP/s bf16"
               if card["pattern"] else "")
        )
    with open(args.card, "w") as f:
        json.dump(card, f, indent=2)
    if args.require_gpu:
        libs = report.get("cuda_libraries", {})
        if not all(libs.values()):
            print(f"CUDA libraries not all found: {libs} ({report.get('gpu_unavailable')})")
            return 1
        if not gpu:
            print(f"no GPU: {report.get('gpu_unavailable')}")
            return 1
    return 0


def cmd_speed(args):
    card = load(args.card) or {}
    config = load(args.config) or {}
    targets = dict(kv.split("=", 1) for kv in args.targets.split())
    targets = {k: float(v) for k, v in targets.items()}
    bw = card.get("hbm_tb_s") and card["hbm_tb_s"] * 1e12
    peak = card.get("bf16_dense_tflops")
    first = lambda name: (json_lines(f"{args.logs}/speed_{name}.json") or [None])[0]  # noqa: E731
    res, fails = {"card": card}, []

    def check(key, value, roofline, unit, note):
        """`value` against `targets[key]` x `roofline` (None: the card is unknown)."""
        frac = targets[key]
        target = roofline * frac if roofline else None
        row = {"value": value, "unit": unit, "roofline": roofline, "target_fraction": frac,
               "target": target, "fraction_of_roofline": value / roofline
               if value is not None and roofline else None, "roofline_is": note}
        row["met"] = None if target is None or value is None else value >= target
        res[key] = row
        if value is None:
            fails.append(f"{key}: no figure")
        elif row["met"] is False and args.enforce:
            fails.append(f"{key} {value:.1f} {unit} < {target:.1f} ({frac:.0%} of {roofline:.1f})")

    # Single-stream decode reads every weight once per token: roofline = bandwidth / bytes.
    for key, name in (("decode_bf16", "decode"), ("decode_q4k", "decode_q4k")):
        b = first(name)
        roof = bw / b["weight_bytes"] if b and bw and b.get("weight_bytes") else None
        check(key, b and b["decode_tps"], roof, "tok/s", "HBM bandwidth / weight bytes")
    # 64 in flight: each step reads the weights once and every sequence's K/V (bf16, the mean
    # context of the workload) once.
    batching, decode = first("batching"), first("decode")
    roof = None
    if batching and decode and bw and config:
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim", config["hidden_size"] // heads)
        kv_per_pos = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 2
        n = batching["concurrency"]
        step_bytes = decode["weight_bytes"] + n * kv_per_pos * args.mean_context
        roof = n * bw / step_bytes
        res["batch_kv_bytes_per_position"] = kv_per_pos
    check("batch_output", batching and batching["output_tps"], roof, "tok/s",
          f"in-flight x bandwidth / (weights + K/V of {args.mean_context} positions each)")
    # Prefill against the dense bf16 tensor-core rate, counting the FLOPs done: the head for
    # the last position only, plus causal attention (QK^T and PV: 2 x T^2 x q width a layer).
    prefill = first("prefill")
    tflops = None
    if prefill and config:
        t, tps, params = prefill["prefill_tokens"], prefill["prefill_tps"], prefill["parameters"]
        d, v, layers = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
        heads = config["num_attention_heads"]
        qdim = heads * config.get("head_dim", d // heads)
        secs = t / max(tps, 1e-9)
        flops = 2.0 * (params - v * d) * t + 2.0 * v * d + 2.0 * layers * t * t * qdim
        tflops = flops / secs / 1e12
        res["prefill_tok_s"] = tps
        res["prefill_tflops_2pt"] = 2.0 * params * t / secs / 1e12
    check("prefill_tflops", tflops, peak, "TFLOP/s", "dense bf16 tensor-core rate")
    # Continuous against static batching on long-tailed outputs: a ratio, the same on any card.
    rows = {r["engine"]: r for r in json_lines(f"{args.logs}/speed_longtail.json")}
    ratio = None
    if "pagoda-continuous" in rows and "pagoda-static" in rows:
        c, s = rows["pagoda-continuous"], rows["pagoda-static"]
        ratio = c["output_tps"] / max(s["output_tps"], 1e-9)
    check("longtail_continuous_over_static", ratio, 1.0, "x", "static batching")
    res["fails"] = fails
    res["enforced"] = args.enforce
    with open(f"{args.logs}/speed.json", "w") as f:
        json.dump(res, f, indent=2)
    for k, r in res.items():
        if isinstance(r, dict) and "value" in r:
            v, t = r["value"], r["target"]
            print(f"{k}: {'-' if v is None else f'{v:.1f}'} {r['unit']}, target "
                  f"{'unscored' if t is None else f'{t:.1f}'} ({r['target_fraction']:g} x "
                  f"{r['roofline_is']})")
    verdict = "met" if not fails else "MISSED: " + "; ".join(fails)
    if not args.enforce and not fails:
        verdict = "not enforced (dry run or unknown card)"
    print("targets " + verdict)
    return 1 if fails else 0


def cmd_summary(args):
    steps = []
    try:
        for line in open(f"{args.out}/steps.tsv"):
            name, status, secs, detail = (line.rstrip("\n").split("\t", 3) + ["", "", ""])[:4]
            steps.append({"step": name, "status": status, "seconds": secs, "detail": detail})
    except OSError:
        pass
    logits = {}
    for root, _, files in sorted(os.walk(args.logs)):
        for f in sorted(files):
            if f.endswith("compare.json"):
                c = load(os.path.join(root, f)) or {}
                key = os.path.relpath(os.path.join(root, f), args.logs)
                logits[key] = {k: c.get(k) for k in (
                    "pass", "gate", "max_diff_tolerance", "tie_eps", "top1_agreement",
                    "top1_agreement_tie_aware", "max_abs_diff", "mean_abs_diff",
                    "pagoda_vs_f32", "transformers_bf16_vs_f32")}
    summary = {
        "dry_run": args.dry_run == "1",
        "part": args.part,
        "device": args.device,
        "deadline_s": int(args.deadline),
        "seconds": int(args.seconds),
        "finished": args.finished == "1",
        "pass": bool(steps) and all(s["status"] != "fail" for s in steps),
        "skipped": [s["step"] for s in steps if s["status"] == "skip"],
        "card": load(f"{args.logs}/card.json"),
        "steps": steps,
        "logits": logits,
        "speed": load(f"{args.logs}/speed.json"),
    }
    tmp = f"{args.out}/summary.json.tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, f"{args.out}/summary.json")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("devices")
    d.add_argument("devices")
    d.add_argument("card")
    d.add_argument("--cards", required=True)
    d.add_argument("--require-gpu", action="store_true")
    s = sub.add_parser("speed")
    s.add_argument("logs")
    s.add_argument("config")
    s.add_argument("card")
    s.add_argument("--targets", required=True)
    s.add_argument("--mean-context", type=int, default=384)
    s.add_argument("--enforce", action="store_true")
    m = sub.add_parser("summary")
    m.add_argument("out")
    m.add_argument("logs")
    for flag in ("--dry-run", "--part", "--device", "--deadline", "--seconds", "--finished"):
        m.add_argument(flag, required=True)
    args = ap.parse_args()
    return {"devices": cmd_devices, "speed": cmd_speed, "summary": cmd_summary}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
