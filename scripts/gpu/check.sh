#!/usr/bin/env bash
# The GPU check of issues 21 and 23, run on the lent H200 machine (`run` of the device tool) from the
# repository root; results go under $OUT, a summary in $OUT/summary.json; exit 0 only when
# every step passed. That machine has CUDA, the driver, PyTorch and transformers but no Rust
# toolchain and no network, so it runs binaries built here (stripped: the tool carries at most
# 64 MiB, work tree included):
#
#   scripts/gpu/build.sh     # here: target/gpu/pagoda (release, stripped) and the
#                            # pagoda-cuda test executables, stripped; checks the 64 MiB
# by hand, the same:
#   cargo build --release -p pagoda-cli
#   mkdir -p target/gpu && strip -o target/gpu/pagoda target/release/pagoda
#   cargo test -p pagoda-cuda --release --no-run    # prints "Executable unittests src/lib.rs
#                                                   #   (target/release/deps/pagoda_cuda-HASH)"
#   strip -o target/gpu/pagoda_cuda_tests target/release/deps/pagoda_cuda-HASH
#   #   (an integration test target NAME as target/gpu/pagoda_cuda_tests_NAME; all are run)
# then, with the device tool: carry ["target/gpu"], command "scripts/gpu/check.sh",
# timeout_s 540 (about 6 minutes estimated since issue 23's steps, never run on a GPU yet;
# each bench is capped at 90 s, the long-tail one at 180 s). For a rerun inside the
# session's 15 device minutes, narrow it: CHECK_SHAPES=smollm2-135m CHECK_SKIP_SPEED=1.
#
# Steps (each one's output under $OUT; a failing step does not stop the others):
#   1. devices: `pagoda devices --json` finds the driver, NVRTC and cuBLAS by dynamic loading
#      from a binary built without a CUDA toolkit, and lists the GPU ($OUT/devices.json).
#   2. logits, for each shape (smollm2-135m, qwen2.5-1.5b): a random-initialised bf16
#      Hugging Face checkpoint made here with transformers (scripts/gpu/make_checkpoint.py, to
#      $CHECK_WORK, not $OUT: the 1.5B one is 3 GB) with 4 prompts x 256 token ids and
#      transformers' logits for them (bf16, and the same weights in float32: the exact
#      answer); `pagoda eval logits --device cuda` on the same folder;
#      scripts/gpu/compare_logits.py against the float32 answer: top-1 agreement >= 0.99 (a
#      near-tie within 0.1 counts) and max |logit diff| <= 0.3 (its MAX_DIFF, reasoned
#      there); strict agreement and transformers-bf16's own distance reported beside
#      ($OUT/<shape>/).
#   2c. quantized weights (issue 23): the SmolLM2-shape checkpoint as a `pagoda quantize`
#      Q4_1 GGUF and quantized at load to each format the GPU keeps quantized
#      (CHECK_QUANT_FORMATS); `eval logits` on the CPU and on the GPU over the same weights;
#      top-1 agreement >= 0.99 ($OUT/quantized/).
#   3. kernel tests: every target/gpu/pagoda_cuda_tests* executable, one test at a time, 120 s
#      each ($OUT/pagoda_cuda_tests*.txt): the unit tests, tests/gpu.rs (pagoda_cuda_tests_gpu:
#      every row, attention and GEMM kernel against the CPU) and tests/quantized.rs
#      (pagoda_cuda_tests_quantized: each quantized format's GEMV at 1 and 3 rows, tiled GEMM
#      at 64, dequantization and embedding against pagoda-kernels' dequantize-then-multiply).
#   3b. the CUDA tests of pagoda-model (the forward pass against the CPU on every tiny
#      architecture and LoRA, batched == alone, copy-on-write) and pagoda-engine (continuous
#      batching with chunked prefill, preemption and the prefix cache on CUDA == each alone),
#      from target/gpu/*_it.xz ($OUT/pagoda_model_it.txt, $OUT/pagoda_engine_it.txt).
#   4. speed, on the 1.5B shape, through the engine: single-stream decode (`bench model`,
#      bf16 >= 1,080 tok/s, 70 % of the HBM roofline; Q4_K weights quantized at load
#      >= 1,200 tok/s), 64 concurrent requests (`bench batching`, >= 25,000 output tok/s;
#      issue 21 asked 400 and 15,000), prefill of a 2,048-token prompt (`bench model`, >= 30 % of the H200's dense
#      bf16 tensor-core rate, 989 TFLOP/s), and continuous against static batching on a
#      long-tailed output-length mix (`bench batching --output-dist long-tail`, 16-1024 tokens, 64 in flight,
#      continuous >= 2x static) ($OUT/speed_*.json).
#
# Dry run on a machine without a GPU (tests the script itself; speed targets not enforced):
#   DRY_RUN=1 PAGODA=target/debug/pagoda PYTHON=venv/bin/python scripts/gpu/check.sh
# uses 2-layer shapes, the CPU, and tiny speed workloads. On 2 cores (2026-12-05, debug build,
# torch 2.15 / transformers 5.25 on CPU) it passed in 92 s: Pagoda against the float32
# reference, top-1 100 %, max |diff| 0.0011 (SmolLM2 shape) and 0.0023 (Qwen2.5 shape);
# transformers-bf16 against the same, top-1 97.5 % / 95.2 %, max |diff| 0.035 / 0.080.
# With step 3b (the model and engine CUDA tests, skipping without a GPU) the dry run passed
# in 210 s on 2 cores (2026-12-05, dev-profile artefacts: 46 MiB with the tree).
# At full depth on the CPU (by hand, CHECK_LAYERS unset): Pagoda 0.0012 (SmolLM2, 30 layers)
# and 0.0039 (Qwen2.5-1.5B, 28 layers, 99.9 % strict); transformers-bf16 0.043 / 0.142.
#
# Environment: PAGODA (binary, default target/gpu/pagoda), PYTHON (default python3), OUT,
# CHECK_WORK (checkpoints, default /tmp/pagoda-gpu-check), DRY_RUN=1, CHECK_LAYERS (layers of
# both shapes; default: full, 2 in a dry run), PAGODA_CHECK_DEVICE (default cuda, cpu in a dry
# run; empty: no --device flag at all), CHECK_SHAPES (default "smollm2-135m qwen2.5-1.5b"),
# CHECK_SKIP_SPEED=1.
# The --device flag is passed to a command only when its --help mentions it, so the script
# works with binaries from before that flag (then a CUDA check reports the step as failed:
# without --device the logits would come from the CPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$(mktemp -d)}"
pagoda="${PAGODA:-target/gpu/pagoda}"
python="${PYTHON:-python3}"
dry="${DRY_RUN:-0}"
work="${CHECK_WORK:-/tmp/pagoda-gpu-check}"
shapes="${CHECK_SHAPES:-smollm2-135m qwen2.5-1.5b}"
if [ "$dry" = 1 ]; then
  device="${PAGODA_CHECK_DEVICE-cpu}"
  layers="${CHECK_LAYERS:-2}"
else
  device="${PAGODA_CHECK_DEVICE-cuda}"
  layers="${CHECK_LAYERS:-}"
fi
[ -x "$pagoda" ] || { echo "no $pagoda: build and strip it here first (see the header)" >&2; exit 1; }
mkdir -p "$out" "$work"
started=$(date +%s)
# NVRTC and cuBLAS: the CUDA toolkit's, else the nvidia-*-cu12 wheels PyTorch brings.
libs="$("$python" -c 'import glob, site; print(":".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null || true)"
for d in /usr/local/cuda/lib64 $(echo "$libs" | tr ':' ' '); do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

# One line per step result: name<TAB>pass|fail|skip<TAB>detail; summary.json is made from it.
results="$out/steps.tsv"
: >"$results"
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" | tee -a "$results"; }

# `--device $device` for the subcommand in "$@" when it has that flag; none when the device is
# empty; fails (return 1) when a non-CPU device is asked of a command without the flag.
device_args() {
  dev_args=()
  [ -n "$device" ] || return 0
  if "$pagoda" "$@" --help 2>/dev/null | grep -q -- '--device'; then
    dev_args=(--device "$device")
  elif [ "$device" != cpu ]; then
    echo "pagoda $* has no --device flag: cannot run it on $device" >&2
    return 1
  fi
  return 0
}

echo "== 1. devices"
if "$pagoda" devices --json >"$out/devices.json" 2>"$out/devices.stderr"; then
  cat "$out/devices.json"; echo
  if "$python" - "$out/devices.json" "$dry" <<'PY'; then
import json, sys
report = json.load(open(sys.argv[1]))
for g in report["gpus"]:
    print(f"cuda:{g['ordinal']} {g['name']} {g['memory_bytes'] / 2**30:.1f} GiB "
          f"sm_{g['compute_capability'][0]}{g['compute_capability'][1]}")
if sys.argv[2] != "1":
    libs = report["cuda_libraries"]
    assert all(libs.values()), f"CUDA libraries not all found: {libs} ({report['gpu_unavailable']})"
    assert report["gpus"], report["gpu_unavailable"]
else:
    print(f"dry run: libraries {report['cuda_libraries']}, gpus {len(report['gpus'])} (not required)")
PY
    record devices pass "$(wc -c <"$out/devices.json") bytes"
  else
    record devices fail "no usable GPU or CUDA library (devices.json)"
  fi
else
  record devices fail "pagoda devices failed (devices.stderr)"
fi

echo "== 2. logits against transformers (device: ${device:-none}, layers: ${layers:-full})"
for shape in $shapes; do
  dir="$work/$shape"; res="$out/$shape"
  rm -rf "$dir"; mkdir -p "$dir" "$res"
  echo "-- $shape: checkpoint"
  t0=$(date +%s)
  if ! "$python" scripts/gpu/make_checkpoint.py --shape "$shape" ${layers:+--layers "$layers"} \
      --out "$dir" >"$res/make_checkpoint.log" 2>&1; then
    tail -5 "$res/make_checkpoint.log"
    record "logits:$shape" fail "make_checkpoint.py failed (make_checkpoint.log)"
    continue
  fi
  cp "$dir/info.json" "$res/checkpoint.json"
  tail -1 "$res/make_checkpoint.log"
  echo "-- $shape: pagoda eval logits"
  if ! device_args eval logits; then
    record "logits:$shape" fail "pagoda eval logits has no --device flag"
    continue
  fi
  t1=$(date +%s)
  if ! "$pagoda" eval logits "$dir/model" --prompts "$dir/prompts.json" --out "$dir/pagoda.npy" \
      --json "${dev_args[@]}" >"$res/eval_logits.json" 2>"$res/eval_logits.stderr"; then
    tail -5 "$res/eval_logits.stderr"
    record "logits:$shape" fail "pagoda eval logits failed (eval_logits.stderr)"
    continue
  fi
  cat "$res/eval_logits.json"
  t2=$(date +%s)
  if "$python" scripts/gpu/compare_logits.py "$dir/reference.npy" "$dir/pagoda.npy" --reference-f32 "$dir/reference_f32.npy" \
      --name "$shape" --json "$res/compare.json" | tee "$res/compare.txt"; then
    record "logits:$shape" pass "$(tail -1 "$res/compare.txt")"
  else
    record "logits:$shape" fail "$(tail -1 "$res/compare.txt")"
  fi
  echo "   ($((t1 - t0)) s checkpoint, $((t2 - t1)) s pagoda, $(($(date +%s) - t2)) s compare)"
  rm -f "$dir/pagoda.npy" "$dir/reference.npy" "$dir/reference_f32.npy"
done

echo "== 2c. quantized weights: the GPU against the CPU on the same quantized model"
# Issue 23: greedy output on the GPU with quantized weights agrees with the CPU path at >= 99 %
# of positions. The SmolLM2-shape checkpoint of step 2, quantized two ways: `pagoda quantize`
# to a Q4_1 GGUF (round to nearest), and at load (`--quantize TYPE`, the same quantizers) to
# each other format the GPU keeps quantized. Both devices run the same quantized weights, so
# the gate is agreement (near-ties within compare_logits.py's TIE_EPS count), with max |diff|
# reported under a loose bound: the CPU multiplies Q8_0/Q4 weights by int8-quantized
# activations, the GPU by f32 (GEMV) or bf16 (GEMM) ones.
qdir="$work/${CHECK_QUANT_SHAPE:-smollm2-135m}"
qformats=${CHECK_QUANT_FORMATS:-"q8_0 q4_0 q4_k q5_k q6_k int8 int4-g64 nf4"}
if [ ! -f "$qdir/model/config.json" ]; then
  record quantized skip "no $qdir/model (step 2 did not make it)"
elif ! device_args eval logits; then
  record quantized fail "pagoda eval logits has no --device flag"
else
  qres="$out/quantized"; mkdir -p "$qres"
  if ! "$pagoda" quantize "$qdir/model" -o "$qdir/q4_1.gguf" --method rtn --bits 4 --force \
      >"$qres/quantize.log" 2>&1; then
    tail -3 "$qres/quantize.log"
    record "quantized:q4_1-gguf" fail "pagoda quantize failed (quantized/quantize.log)"
  fi
  for q in gguf:q4_1 $qformats; do
    if [ "$q" = gguf:q4_1 ]; then
      [ -f "$qdir/q4_1.gguf" ] || continue
      name=q4_1-gguf; src="$qdir/q4_1.gguf"; qargs=()
    else
      name=$q; src="$qdir/model"; qargs=(--quantize "$q")
    fi
    ok=1
    for side in cpu gpu; do
      if [ "$side" = cpu ]; then sargs=(--device cpu); else sargs=("${dev_args[@]}"); fi
      if ! "$pagoda" eval logits "$src" --prompts "$qdir/prompts.json" --out "$qdir/$name.$side.npy" \
          --json "${qargs[@]}" "${sargs[@]}" >"$qres/$name.$side.json" 2>"$qres/$name.$side.stderr"; then
        tail -3 "$qres/$name.$side.stderr"
        record "quantized:$name" fail "pagoda eval logits on the $side failed (quantized/$name.$side.stderr)"
        ok=0; break
      fi
    done
    if [ "$ok" = 1 ]; then
      if "$python" scripts/gpu/compare_logits.py "$qdir/$name.cpu.npy" "$qdir/$name.gpu.npy" \
          --name "$name" --reference-name "pagoda on the cpu" --max-diff 1.0 --json "$qres/$name.compare.json" >"$qres/$name.compare.txt"; then
        record "quantized:$name" pass "$(tail -1 "$qres/$name.compare.txt")"
      else
        record "quantized:$name" fail "$(tail -1 "$qres/$name.compare.txt")"
      fi
    fi
    rm -f "$qdir/$name.cpu.npy" "$qdir/$name.gpu.npy"
  done
fi

echo "== 3. kernel tests"
found=0
for t in target/gpu/pagoda_cuda_tests*; do
  [ -x "$t" ] || continue
  found=1
  name="$(basename "$t")"
  if timeout 120 "$t" --test-threads 1 >"$out/$name.txt" 2>&1; then
    record "kernels:$name" pass "$(grep -E '^test result' "$out/$name.txt" | tail -1)"
  else
    tail -20 "$out/$name.txt"
    record "kernels:$name" fail "$(grep -E '^test result' "$out/$name.txt" | tail -1) (see $name.txt)"
  fi
  grep -i "skipped" "$out/$name.txt" | head -3
done
[ "$found" = 1 ] || record kernels skip "no target/gpu/pagoda_cuda_tests* (see the header)"

echo "== 3b. the CUDA forward pass and engine tests (pagoda-model, pagoda-engine)"
# Their tests read tests/golden/ through the path they were built in: link it to this tree.
if [ -f target/gpu/built_in ]; then
  built="$(cat target/gpu/built_in)"
  if [ ! -e "$built/tests/golden" ]; then
    mkdir -p "$(dirname "$built")" && ln -sfn "$PWD" "$built" || echo "cannot link $built to $PWD"
  fi
fi
found=0
for packed in target/gpu/*_it.xz; do
  [ -f "$packed" ] || continue
  found=1
  name="$(basename "$packed" .xz)"
  mkdir -p "$work/bin" && xz -dc "$packed" >"$work/bin/$name" && chmod +x "$work/bin/$name"
  # cuda: pagoda-model's CUDA-vs-CPU and on_cuda tests; on_cuda: the engine's.
  filter=$([ "$name" = pagoda_model_it ] && echo cuda || echo on_cuda)
  if timeout 180 "$work/bin/$name" "$filter" --test-threads 1 --nocapture >"$out/$name.txt" 2>&1; then
    record "gpu-tests:$name" pass "$(grep -E '^test result' "$out/$name.txt" | tail -1)"
  else
    tail -30 "$out/$name.txt"
    record "gpu-tests:$name" fail "$(grep -E '^test result' "$out/$name.txt" | tail -1) (see $name.txt)"
  fi
  if grep -q "skipped: no GPU" "$out/$name.txt" && [ "$dry" != 1 ]; then
    record "gpu-tests:$name" fail "skipped on the GPU machine: $(grep -m1 'skipped: no GPU' "$out/$name.txt")"
  fi
done
[ "$found" = 1 ] || record gpu-tests skip "no target/gpu/*_it.xz (see scripts/gpu/build.sh)"

echo "== 4. speed (1.5B shape, through the engine)"
model="$work/qwen2.5-1.5b/model"
if [ "${CHECK_SKIP_SPEED:-0}" = 1 ]; then
  record speed skip "CHECK_SKIP_SPEED=1"
elif [ ! -f "$model/config.json" ]; then
  record speed fail "no $model (step 2 did not make it)"
elif ! device_args bench model || ! { bench_dev=("${dev_args[@]}"); device_args bench batching; }; then
  record speed fail "pagoda bench has no --device flag"
else
  batch_dev=("${dev_args[@]}")
  if [ "$dry" = 1 ]; then
    # Tiny workloads: the same commands and parsing, in seconds on 2 cores.
    decode=(--prompt-tokens 16 --gen-tokens 8 --repeat 1)
    batching=(--concurrency 4 --requests 4 --prompt-len 8-16 --output-len 4-8)
    prefill=(--prompt-tokens 64 --gen-tokens 1 --repeat 1)
    longtail=(--concurrency 4 --requests 8 --prompt-len 8-16 --output-len 2-32)
    limit=300
  else
    decode=(--prompt-tokens 32 --gen-tokens 256 --repeat 3)
    batching=(--concurrency 64 --requests 128 --prompt-len 64-512 --output-len 128-256)
    prefill=(--prompt-tokens 2048 --gen-tokens 1 --repeat 3)
    # Issue 23 point 6: output lengths as chat logs have them (bounded Pareto: median ~32,
    # ~1.6 % above 512, up to 1,024), 128 requests at 64 in flight: two static batches, each
    # as long as its longest request.
    longtail=(--concurrency 64 --requests 128 --prompt-len 64-256 --output-len 16-1024)
    limit=90
  fi
  run_bench() { # name, then the pagoda arguments
    local name=$1; shift
    echo "-- $name: pagoda $*"
    if timeout "$limit" "$pagoda" "$@" --json >"$out/speed_$name.json" 2>"$out/speed_$name.stderr"; then
      cat "$out/speed_$name.json"
    else
      echo "failed or timed out after ${limit}s (speed_$name.stderr)"; tail -3 "$out/speed_$name.stderr"
      : >"$out/speed_$name.json"
    fi
  }
  run_bench decode bench model "$model" --no-peer "${decode[@]}" "${bench_dev[@]}"
  run_bench decode_q4k bench model "$model" --no-peer --quantize q4_k "${decode[@]}" "${bench_dev[@]}"
  run_bench batching bench batching "$model" --modes continuous "${batching[@]}" "${batch_dev[@]}"
  run_bench prefill bench model "$model" --no-peer "${prefill[@]}" "${bench_dev[@]}"
  limit=$((limit * 2)) run_bench longtail bench batching "$model" --modes continuous,static \
    --output-dist long-tail "${longtail[@]}" "${batch_dev[@]}"
  if "$python" - "$out" "$model/config.json" "$dry" >"$out/speed.txt" <<'PY'; then
import json, sys
out, config, dry = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3] == "1"
H200_BF16_DENSE_TFLOPS = 989.0
def first(name):
    lines = [l for l in open(f"{out}/speed_{name}.json") if l.strip().startswith("{")]
    return json.loads(lines[0]) if lines else None
decode, batching, prefill = first("decode"), first("batching"), first("prefill")
def by_engine(name):
    rows = [json.loads(l) for l in open(f"{out}/speed_{name}.json") if l.strip().startswith("{")]
    return {r["engine"]: r for r in rows}
res, fails = {}, []
def check(key, value, target, unit):
    res[key] = {"value": value, "target": target, "unit": unit,
                "met": value is not None and value >= target}
    if value is None:
        fails.append(f"{key}: no figure")
    elif value < target and not dry:
        fails.append(f"{key} {value:.1f} {unit} < {target}")
# Issue 23's targets (part 1's were 400 and 15,000): 70 % of the HBM roofline in bf16 and
# 1,200 tok/s with Q4_K weights (quantized at load) for one stream, 25,000 at 64 in flight.
decode_q4k = first("decode_q4k")
check("decode_tok_s", decode and decode["decode_tps"], 1080.0, "tok/s")
check("decode_q4k_tok_s", decode_q4k and decode_q4k["decode_tps"], 1200.0, "tok/s")
check("batch64_output_tok_s", batching and batching["output_tps"], 25000.0, "tok/s")
if prefill:
    # Achieved rate as issue 21 states it: 2 x parameters x tokens / time. Also, stricter,
    # the FLOPs the prefill really does: the output head runs for the last position only
    # (its V x d weights counted once), plus causal attention (QK^T and PV: 2 x T^2 x heads x
    # head_dim per layer). The gate uses the stricter figure.
    t, tps, params = prefill["prefill_tokens"], prefill["prefill_tps"], prefill["parameters"]
    d, v, layers = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    qdim = config["num_attention_heads"] * config.get("head_dim", d // config["num_attention_heads"])
    secs = t / tps
    simple = 2.0 * params * t / secs / 1e12
    real = (2.0 * (params - v * d) * t + 2.0 * v * d + 2.0 * layers * t * t * qdim) / secs / 1e12
    res["prefill_tflops_2pt"] = {"value": simple, "pct_of_peak": 100 * simple / H200_BF16_DENSE_TFLOPS}
    check("prefill_pct_of_bf16_peak", 100 * real / H200_BF16_DENSE_TFLOPS, 30.0, "%")
    res["prefill_pct_of_bf16_peak"].update(tflops=real, prefill_tok_s=tps, prompt_tokens=t)
else:
    check("prefill_pct_of_bf16_peak", None, 30.0, "%")
longtail = by_engine("longtail")
if "pagoda-continuous" in longtail and "pagoda-static" in longtail:
    c, s = longtail["pagoda-continuous"], longtail["pagoda-static"]
    check("longtail_continuous_over_static", c["output_tps"] / max(s["output_tps"], 1e-9), 2.0, "x")
    res["longtail_continuous_over_static"].update(continuous=c, static=s)
else:
    check("longtail_continuous_over_static", None, 2.0, "x")
res["dry_run"] = dry
res["fails"] = fails
json.dump(res, open(f"{out}/speed.json", "w"), indent=2)
for k, r in res.items():
    if isinstance(r, dict):
        print(f"{k}: {r}")
print("targets " + ("not enforced (dry run)" if dry else ("met" if not fails else "MISSED: " + "; ".join(fails))))
sys.exit(1 if fails else 0)
PY
    cat "$out/speed.txt"
    record speed pass "$(tail -1 "$out/speed.txt")"
  else
    cat "$out/speed.txt"
    record speed fail "$(tail -1 "$out/speed.txt")"
  fi
fi

echo "== summary"
"$python" - "$out" "$dry" "${device:-}" "${layers:-full}" "$(($(date +%s) - started))" <<'PY'
import json, os, sys
out, dry, device, layers, secs = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4], int(sys.argv[5])
steps = []
for line in open(f"{out}/steps.tsv"):
    name, status, detail = line.rstrip("\n").split("\t", 2)
    steps.append({"step": name, "status": status, "detail": detail})
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
logits = {}
for d in sorted(os.listdir(out)):
    c = load(f"{out}/{d}/compare.json")
    if c:
        logits[d] = {k: c.get(k) for k in (
            "pass", "gate", "max_diff_tolerance", "tie_eps", "top1_agreement",
            "top1_agreement_tie_aware", "max_abs_diff", "mean_abs_diff", "pagoda_vs_f32",
            "transformers_bf16_vs_f32")}
        logits[d]["eval_logits"] = load(f"{out}/{d}/eval_logits.json")
summary = {
    "dry_run": dry, "device": device, "layers": layers, "seconds": secs,
    "pass": all(s["status"] != "fail" for s in steps),
    "steps": steps, "logits": logits, "speed": load(f"{out}/speed.json"),
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
for s in steps:
    print(f"{s['status']:4}  {s['step']}: {s['detail']}")
print(f"{'PASS' if summary['pass'] else 'FAIL'} in {secs} s ({out}/summary.json)")
sys.exit(0 if summary["pass"] else 1)
PY
