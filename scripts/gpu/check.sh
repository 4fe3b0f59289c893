#!/usr/bin/env bash
# The GPU check (issues 21, 23 and 37): run on a lent GPU machine (the device tool's `run`), from
# the repository root, with binaries built here by scripts/gpu/build.sh (that machine has the
# driver, PyTorch and transformers, but no Rust toolchain and no network).
#
# THE PLAN: two calls that fit the session's 15 device minutes, machine start included:
#
#   here:   scripts/gpu/build.sh                 # target/gpu/, stripped; checks the 64 MiB
#   call 1: correctness (steps 1-5). carry ["target/gpu"], timeout_s 330, command
#           "CHECK_PART=correctness CHECK_DEADLINE_S=300 scripts/gpu/check.sh"
#   call 2: speed (steps 1 and 6), AT ONCE: the machine goes back after idle_release_s (30 s
#           at present; the device tool's status says), and call 1's files are already here.
#           carry ["target/gpu"], timeout_s 240, command
#           "CHECK_PART=speed CHECK_DEADLINE_S=210 scripts/gpu/check.sh"
#   then give_back.
#   Device time: start 2-3 min + 5.5 + 4 = ~12 min; ~14.5 if call 2 finds the machine gone (a
#   second start; step 6 then remakes its checkpoint, ~40 s, within its deadline).
#
# One call of everything instead: CHECK_PART=all (the default), CHECK_DEADLINE_S=540 (the
# default), timeout_s 600: ~12.5 device minutes, and nothing is lost if the machine goes back
# between calls. The step times below are estimates: no GPU has run this script yet.
#
# The deadline: every step gets the time left (CHECK_DEADLINE_S from the start, less a reserve
# for the summary), every command in it runs under `timeout` with what is left, and a step whose
# estimated need is more than what is left is skipped with that reason recorded. A skip is not a
# failure; summary.json's "skipped" lists them and "finished" says whether the end was reached.
#
# Steps, in order of value (CHECK_PART: correctness = 1-5, speed = 1 and 6, all = 1-6):
#   1. devices   `pagoda devices --json` finds the driver, NVRTC and cuBLAS from a binary built
#                without a CUDA toolkit, and names the GPU; its roofline is looked up in CARDS.
#   2. kernels   every target/gpu/pagoda_cuda_tests* executable (pagoda-cuda's unit tests,
#                tests/gpu.rs and tests/quantized.rs: each kernel against pagoda-kernels).
#   3. logits    per shape (CHECK_SHAPES): a random bf16 checkpoint made on the machine by
#                make_checkpoint.py with transformers' logits (bf16 and float32), `pagoda eval
#                logits` on the device, compare_logits.py against the float32 answer (top-1
#                >= 0.99 counting near-ties, max |diff| <= 0.3). Without torch (a dry run here)
#                the checkpoint is made with numpy and the device is compared with Pagoda on
#                the CPU instead.
#   4. gpu-tests the CUDA tests of pagoda-model (forward pass against the CPU on every tiny
#                architecture, LoRA, splits) and pagoda-engine (batching, preemption, prefix
#                cache, speculative decoding on CUDA), from target/gpu/*_it.xz. A test that
#                prints "skipped: no GPU" fails the step.
#   5. quantized the first shape as a Q4_1 GGUF and quantized at load to each format the GPU
#                keeps quantized (CHECK_QUANT_FORMATS): the device against the CPU on the same
#                weights, top-1 >= 0.99.
#   6. speed     on CHECK_SPEED_SHAPE (Qwen2.5-1.5B's shape; made with --no-reference when
#                call 1 did not leave it in CHECK_WORK): single-stream decode in bf16 and Q4_K,
#                64 requests in flight, a 2,048-token prefill, continuous against static
#                batching on long-tailed outputs. Targets are fractions (TARGETS) of the
#                roofline of the card found (CARDS): never a fixed figure of one card.
#
# What comes back ($OUT, 3 files; the device tool returns at most 8): summary.json and
# steps.tsv (step, pass|fail|skip, seconds, detail), both rewritten after every step, and
# logs.tar.xz, every log and JSON of the run, repacked after every step. A run killed from
# outside still leaves all three as of its last finished step (and TERM rewrites them).
# `tar -xJf logs.tar.xz -C somewhere` to read it; console.log in it is the whole output.
#
# Dry run (`--dry-run` or CHECK_DRY_RUN=1; DRY_RUN=1 is the old spelling): here, without a GPU,
# through the CUDA interpreter (PAGODA_CUDA_INTERPRET=1: the kernels and the CUDA path run on
# the CPU), tiny shapes (tiny-llama, tiny-qwen2: 2 layers, hidden 256), 32-token prompts, tiny
# speed workloads whose targets are reported, not enforced. It tests the script, the deadline
# and the interpreter; torch and transformers are used when they import, numpy alone otherwise.
#   GPU_BUILD_PROFILE=dev scripts/gpu/build.sh && scripts/gpu/check.sh --dry-run
#
# Environment: OUT (default: a new temporary folder), PAGODA (default target/gpu/pagoda),
# PYTHON (python3), CHECK_WORK (checkpoints and unpacked binaries, not returned; default
# /tmp/pagoda-gpu-check), CHECK_DEADLINE_S (540), CHECK_PART (all|correctness|speed),
# CHECK_SHAPES, CHECK_LAYERS (layers of the logits shapes; default all, 2 in a dry run),
# CHECK_QUANT_FORMATS, CHECK_SPEED_SHAPE, PAGODA_CHECK_DEVICE (default cuda; in a dry run
# cuda-interpret when the binary knows it, else cuda with PAGODA_CUDA_INTERPRET=1).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

# Rooflines of the cards the check may meet, from NVIDIA's data sheets: name pattern (the first
# found in the GPU's name wins) | HBM bandwidth, TB/s | dense bf16 tensor-core rate, TFLOP/s
# (the sheets' "with sparsity" figures are twice these). H100 SXM is "NVIDIA H100 80GB HBM3".
CARDS='
H200 NVL|4.8|835
H200|4.8|989
H100 PCIe|2.0|756
H100 NVL|3.9|835
H100|3.35|989
A100-SXM4-80GB|2.04|312
A100|1.56|312
'
# Speed targets, as fractions of the card's roofline (check_report.py computes each roofline:
# decode = bandwidth / weight bytes; 64 in flight = 64 x bandwidth / (weights + their K/V);
# prefill = the dense bf16 rate; long-tail = static batching's throughput). For an H100 SXM and
# the 1.5B shape in bf16 (3.1 GB): decode 0.70 x 1,084 = 760 tok/s; on an H200, 1,090 tok/s.
TARGETS='decode_bf16=0.70 decode_q4k=0.25 batch_output=0.30 prefill_tflops=0.30
longtail_continuous_over_static=2.0'

# ---- settings ------------------------------------------------------------------------------
dry="${CHECK_DRY_RUN:-${DRY_RUN:-0}}"
[ "${1:-}" = --dry-run ] && dry=1
part="${CHECK_PART:-all}"
deadline_s="${CHECK_DEADLINE_S:-540}"
reserve_s=15 # kept for the last summary and the archive
out="${OUT:-$(mktemp -d)}"
python="${PYTHON:-python3}"
work="${CHECK_WORK:-/tmp/pagoda-gpu-check}"
logs="$work/logs"
started=$(date +%s)
if [ -n "${PAGODA:-}" ]; then
  pagoda="$PAGODA"
elif [ "$dry" = 1 ] && [ ! -x target/gpu/pagoda ]; then
  pagoda="${CARGO_TARGET_DIR:-target}/debug/pagoda"
else
  pagoda=target/gpu/pagoda
fi
if [ "$dry" = 1 ]; then
  export PAGODA_CUDA_INTERPRET=1
  shapes="${CHECK_SHAPES:-tiny-llama tiny-qwen2}"
  layers="${CHECK_LAYERS:-2}"
  positions=32
  speed_shape="${CHECK_SPEED_SHAPE:-tiny-qwen2}"
  if "$pagoda" eval logits --help 2>/dev/null | grep -q cuda-interpret; then
    device="${PAGODA_CHECK_DEVICE-cuda-interpret}"
  else
    device="${PAGODA_CHECK_DEVICE-cuda}"
  fi
else
  shapes="${CHECK_SHAPES:-smollm2-135m qwen2.5-1.5b}"
  layers="${CHECK_LAYERS:-}"
  positions=256
  speed_shape="${CHECK_SPEED_SHAPE:-qwen2.5-1.5b}"
  device="${PAGODA_CHECK_DEVICE-cuda}"
fi
qformats="${CHECK_QUANT_FORMATS:-q8_0 q4_0 q4_k q5_k q6_k int8 int4-g64 nf4}"
case "$part" in all | correctness | speed) ;; *)
  echo "CHECK_PART must be all, correctness or speed" >&2
  exit 2
  ;;
esac
[ -x "$pagoda" ] || {
  echo "no $pagoda: build it first (scripts/gpu/build.sh)" >&2
  exit 2
}
mkdir -p "$out" "$work"
rm -rf "$logs" && mkdir -p "$logs"
: >"$out/steps.tsv"
rm -f "$out/summary.json" "$out/logs.tar.xz"
exec > >(tee -a "$logs/console.log") 2>&1

# NVRTC and cuBLAS: the CUDA toolkit's, else the nvidia-* wheels PyTorch brings (CUDA 12's
# nvidia/<lib>/lib, CUDA 13's nvidia/cu13/lib).
wheel_libs="$("$python" -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null || true)"
for d in /usr/local/cuda/lib64 $wheel_libs; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

# ---- the clock, the record, the archive -----------------------------------------------------
elapsed() { echo $(($(date +%s) - started)); }
# Seconds a step may still use (the reserve kept back).
left() { echo $((deadline_s - $(elapsed) - reserve_s)); }

# `limited CAP CMD...`: CMD under `timeout` of the smaller of CAP and the time left; 124 when
# no time is left at all.
limited() {
  local cap=$1 t
  shift
  t=$(left)
  [ "$cap" -lt "$t" ] && t=$cap
  if [ "$t" -lt 2 ]; then
    echo "no time left for: $*"
    return 124
  fi
  timeout -k 5 "$t" "$@"
}

finished=0
current_step=""
write_summary() {
  "$python" scripts/gpu/check_report.py summary "$out" "$logs" --dry-run "$dry" --part "$part" \
    --device "${device:-none}" --deadline "$deadline_s" --seconds "$(elapsed)" \
    --finished "$finished" || echo "summary.json not written"
}
pack_logs() {
  cp "$out/steps.tsv" "$logs/steps.tsv" 2>/dev/null
  tar -C "$logs" -cJf "$out/logs.tar.xz.tmp" . && mv "$out/logs.tar.xz.tmp" "$out/logs.tar.xz"
}
# `record NAME pass|fail|skip DETAIL`: one row of steps.tsv, with the step's seconds so far.
record() {
  local row
  row="$(printf '%s\t%s\t%s\t%s' "$1" "$2" "$(($(date +%s) - step_started))" "${3//$'\n'/ }")"
  printf '%s\n' "$row" >>"$out/steps.tsv"
  printf '   [%s] %s\n' "$2" "$row"
}
on_term() {
  # The signal reached the whole process group, tee included: write to the log file alone.
  exec >>"$logs/console.log" 2>&1
  echo "== killed during ${current_step:-setup} after $(elapsed) s"
  step_started=$(date +%s)
  record "${current_step:-setup}" fail "killed from outside after $(elapsed) s"
  write_summary
  pack_logs
  exit 143
}
trap on_term TERM INT
trap '' PIPE

# `step NAME NEEDS_S PARTS FUNCTION`: runs FUNCTION when this run's part includes it and about
# NEEDS_S seconds are left, else records why not; then rewrites summary.json and the archive.
step() {
  local name=$1 needs=$2 parts=$3 fn=$4
  step_started=$(date +%s)
  current_step=$name
  if [[ " $parts " != *" $part "* ]]; then
    return 0
  fi
  echo "== $name ($(elapsed) s in, $(left) s left)"
  if [ "$(left)" -lt "$needs" ]; then
    record "$name" skip "$(left) s left of the deadline, the step needs ~$needs s"
  else
    "$fn"
  fi
  write_summary
  pack_logs
}

# `--device DEV` for `pagoda SUBCOMMAND...` when its --help has the flag (none for an empty
# device); fails when a non-CPU device is asked of a command without it.
device_args() {
  dev_args=()
  [ -n "$device" ] || return 0
  if "$pagoda" "$@" --help 2>/dev/null | grep -q -- '--device'; then
    dev_args=(--device "$device")
  elif [ "$device" != cpu ]; then
    echo "pagoda $* has no --device flag: cannot run it on $device"
    return 1
  fi
}

# `make_shape SHAPE [--no-reference]`: the checkpoint in $work/SHAPE (kept when it is there).
make_shape() {
  local shape=$1 dir="$work/$1"
  shift
  # Kept when made with the same layers and positions, with reference logits unless none are
  # wanted or none can be made (numpy).
  if [ -f "$dir/model/config.json" ] && [ "$(cat "$dir/args" 2>/dev/null)" = "$layers $positions" ] &&
    { [ "${1:-}" = --no-reference ] || [ -f "$dir/reference_f32.npy" ] ||
      grep -q '"backend": "numpy"' "$dir/info.json"; }; then
    echo "-- $shape: checkpoint kept from an earlier run"
    return 0
  fi
  rm -rf "$dir" && mkdir -p "$dir" "$logs/$shape"
  echo "-- $shape: checkpoint"
  limited 240 "$python" scripts/gpu/make_checkpoint.py --shape "$shape" ${layers:+--layers "$layers"} \
    --positions "$positions" --out "$dir" "$@" >"$logs/$shape/make_checkpoint.log" 2>&1 || {
    tail -5 "$logs/$shape/make_checkpoint.log"
    return 1
  }
  cp "$dir/info.json" "$logs/$shape/checkpoint.json"
  echo "$layers $positions" >"$dir/args"
}

# ---- the steps -------------------------------------------------------------------------------
step_devices() {
  limited 60 "$pagoda" devices --json >"$logs/devices.json" 2>"$logs/devices.stderr"
  local rc=$? require=--require-gpu
  [ "$rc" = 0 ] || {
    record devices fail "pagoda devices failed, rc $rc (devices.stderr)"
    return
  }
  if "$python" scripts/gpu/check_report.py devices "$logs/devices.json" "$logs/card.json" \
    --cards "$CARDS" $require >"$logs/devices.txt" 2>&1; then
    record devices pass "$(head -1 "$logs/devices.txt")"
  else
    record devices fail "$(tail -1 "$logs/devices.txt")"
  fi
  cat "$logs/devices.txt"
}

step_kernels() {
  local found=0 t name skips threads=()
  # One test at a time on a GPU; the interpreter is slow, so use every core there.
  [ "$dry" = 1 ] || threads=(--test-threads 1)
  for t in target/gpu/pagoda_cuda_tests*; do
    [ -x "$t" ] || continue
    found=1
    name="$(basename "$t")"
    if limited 240 "$t" "${threads[@]}" >"$logs/$name.txt" 2>&1; then
      record "kernels:$name" pass "$(grep -E '^test result' "$logs/$name.txt" | tail -1)"
    else
      tail -20 "$logs/$name.txt"
      record "kernels:$name" fail "$(grep -E '^test result' "$logs/$name.txt" | tail -1) ($name.txt)"
    fi
    skips=$(grep -c "skipped: no GPU" "$logs/$name.txt")
    [ "$skips" = 0 ] || record "kernels:$name" fail "$skips tests skipped: no GPU"
  done
  [ "$found" = 1 ] || record kernels fail "no target/gpu/pagoda_cuda_tests* (scripts/gpu/build.sh)"
}

step_logits() {
  local shape dir res ref
  for shape in $shapes; do
    dir="$work/$shape"
    res="$logs/$shape"
    mkdir -p "$res"
    make_shape "$shape" || {
      record "logits:$shape" fail "make_checkpoint.py failed ($shape/make_checkpoint.log)"
      continue
    }
    device_args eval logits || {
      record "logits:$shape" fail "pagoda eval logits has no --device flag"
      return
    }
    echo "-- $shape: pagoda eval logits ${dev_args[*]}"
    if ! limited 180 "$pagoda" eval logits "$dir/model" --prompts "$dir/prompts.json" \
      --out "$dir/pagoda.npy" --json "${dev_args[@]}" >"$res/eval_logits.json" 2>"$res/eval_logits.stderr"; then
      tail -5 "$res/eval_logits.stderr"
      record "logits:$shape" fail "pagoda eval logits failed ($shape/eval_logits.stderr)"
      continue
    fi
    if [ -f "$dir/reference_f32.npy" ]; then
      ref=(--reference-f32 "$dir/reference_f32.npy" "$dir/reference.npy")
    else
      # No transformers here: the same weights through Pagoda's CPU path.
      echo "-- $shape: no reference logits (numpy checkpoint): pagoda on the cpu instead"
      if ! limited 180 "$pagoda" eval logits "$dir/model" --prompts "$dir/prompts.json" \
        --out "$dir/cpu.npy" --json --device cpu >"$res/eval_logits_cpu.json" 2>"$res/eval_logits_cpu.stderr"; then
        record "logits:$shape" fail "pagoda eval logits --device cpu failed ($shape/eval_logits_cpu.stderr)"
        continue
      fi
      ref=(--reference-name "pagoda on the cpu" "$dir/cpu.npy")
    fi
    if "$python" scripts/gpu/compare_logits.py "${ref[@]}" "$dir/pagoda.npy" --name "$shape" \
      --json "$res/compare.json" >"$res/compare.txt" 2>&1; then
      record "logits:$shape" pass "$(tail -1 "$res/compare.txt")"
    else
      record "logits:$shape" fail "$(tail -1 "$res/compare.txt")"
    fi
    tail -1 "$res/compare.txt"
    rm -f "$dir/pagoda.npy" "$dir/cpu.npy"
  done
}

step_gpu_tests() {
  local found=0 packed name filter skips built
  # Their tests read tests/golden/ through the path they were built in: link it to this tree.
  if [ -f target/gpu/built_in ]; then
    built="$(cat target/gpu/built_in)"
    if [ ! -e "$built/tests/golden" ]; then
      mkdir -p "$(dirname "$built")" && ln -sfn "$PWD" "$built" || echo "cannot link $built to $PWD"
    fi
  fi
  for packed in target/gpu/*_it.xz; do
    [ -f "$packed" ] || continue
    found=1
    name="$(basename "$packed" .xz)"
    mkdir -p "$work/bin" && xz -dc "$packed" >"$work/bin/$name" && chmod +x "$work/bin/$name"
    # cuda: pagoda-model's CUDA-vs-CPU and on_cuda tests; on_cuda: the engine's.
    filter=$([ "$name" = pagoda_model_it ] && echo cuda || echo on_cuda)
    if limited 240 "$work/bin/$name" "$filter" >"$logs/$name.txt" 2>&1; then
      record "gpu-tests:$name" pass "$(grep -E '^test result' "$logs/$name.txt" | tail -1)"
    else
      tail -30 "$logs/$name.txt"
      record "gpu-tests:$name" fail "$(grep -E '^test result' "$logs/$name.txt" | tail -1) ($name.txt)"
    fi
    skips=$(grep -c "skipped: no GPU" "$logs/$name.txt")
    [ "$skips" = 0 ] || record "gpu-tests:$name" fail "$skips tests skipped: $(grep -m1 'skipped: no GPU' "$logs/$name.txt")"
  done
  [ "$found" = 1 ] || record gpu-tests fail "no target/gpu/*_it.xz (scripts/gpu/build.sh)"
}

# The first shape quantized two ways: `pagoda quantize` to a Q4_1 GGUF, and at load to each
# format the GPU keeps quantized. Both devices run the same quantized weights, so the gate is
# agreement; max |diff| is bounded loosely (the CPU multiplies Q8_0/Q4 weights by int8
# activations, the GPU by f32 or bf16 ones).
step_quantized() {
  local shape dir res q name src side ok
  shape="${shapes%% *}"
  dir="$work/$shape"
  res="$logs/quantized"
  mkdir -p "$res"
  make_shape "$shape" || {
    record quantized fail "no checkpoint of $shape"
    return
  }
  device_args eval logits || {
    record quantized fail "pagoda eval logits has no --device flag"
    return
  }
  limited 120 "$pagoda" quantize "$dir/model" -o "$dir/q4_1.gguf" --method rtn --bits 4 --force \
    >"$res/quantize.log" 2>&1 || record "quantized:q4_1-gguf" fail "pagoda quantize failed (quantized/quantize.log)"
  for q in gguf:q4_1 $qformats; do
    if [ "$q" = gguf:q4_1 ]; then
      [ -f "$dir/q4_1.gguf" ] || continue
      name=q4_1-gguf src="$dir/q4_1.gguf" qargs=()
    else
      name=$q src="$dir/model" qargs=(--quantize "$q")
    fi
    ok=1
    for side in cpu gpu; do
      if [ "$side" = cpu ]; then sargs=(--device cpu); else sargs=("${dev_args[@]}"); fi
      if ! limited 120 "$pagoda" eval logits "$src" --prompts "$dir/prompts.json" --out "$dir/$name.$side.npy" \
        --json "${qargs[@]}" "${sargs[@]}" >"$res/$name.$side.json" 2>"$res/$name.$side.stderr"; then
        tail -3 "$res/$name.$side.stderr"
        record "quantized:$name" fail "eval logits on the $side failed (quantized/$name.$side.stderr)"
        ok=0
        break
      fi
    done
    if [ "$ok" = 1 ]; then
      if "$python" scripts/gpu/compare_logits.py "$dir/$name.cpu.npy" "$dir/$name.gpu.npy" --name "$name" \
        --reference-name "pagoda on the cpu" --max-diff 1.0 --json "$res/$name.compare.json" \
        >"$res/$name.compare.txt" 2>&1; then
        record "quantized:$name" pass "$(tail -1 "$res/$name.compare.txt")"
      else
        record "quantized:$name" fail "$(tail -1 "$res/$name.compare.txt")"
      fi
    fi
    rm -f "$dir/$name.cpu.npy" "$dir/$name.gpu.npy"
  done
}

# `bench NAME CAP PAGODA-ARGS...`: one `pagoda bench ... --json` into $logs/speed_NAME.json.
bench() {
  local name=$1 cap=$2
  shift 2
  echo "-- $name: pagoda $*"
  if limited "$cap" "$pagoda" "$@" --json >"$logs/speed_$name.json" 2>"$logs/speed_$name.stderr"; then
    grep '^{' "$logs/speed_$name.json"
  else
    echo "failed or out of time (speed_$name.stderr)"
    tail -3 "$logs/speed_$name.stderr"
  fi
}

step_speed() {
  local model="$work/$speed_shape/model" enforce=--enforce
  local decode batching prefill longtail
  if [ "$dry" = 1 ]; then
    # Tiny workloads: the same commands and parsing; the figures mean nothing. A small KV pool:
    # the interpreter's "device memory" is host memory (`bench model` has no such flag, and
    # takes 90 % of what the interpreter reports).
    decode=(--prompt-tokens 16 --gen-tokens 8 --repeat 1)
    batching=(--concurrency 4 --requests 4 --prompt-len 8-16 --output-len 4-8 --kv-cache-memory 64MiB)
    prefill=(--prompt-tokens 64 --gen-tokens 1 --repeat 1)
    longtail=(--concurrency 4 --requests 8 --prompt-len 8-16 --output-len 2-32 --kv-cache-memory 64MiB)
    enforce=
  else
    decode=(--prompt-tokens 32 --gen-tokens 256 --repeat 3)
    batching=(--concurrency 64 --requests 128 --prompt-len 64-512 --output-len 128-256)
    prefill=(--prompt-tokens 2048 --gen-tokens 1 --repeat 3)
    # Output lengths as chat logs have them (bounded Pareto: median ~32, ~1.6 % above 512, up
    # to 1,024), 128 requests at 64 in flight: two static batches, each as long as its longest.
    longtail=(--concurrency 64 --requests 128 --prompt-len 64-256 --output-len 16-1024)
  fi
  # An unknown card (or the interpreter) has no roofline: figures reported, not scored.
  grep -q '"pattern": "' "$logs/card.json" 2>/dev/null || enforce=
  make_shape "$speed_shape" --no-reference || {
    record speed fail "no checkpoint of $speed_shape ($speed_shape/make_checkpoint.log)"
    return
  }
  device_args bench model || {
    record speed fail "pagoda bench model has no --device flag"
    return
  }
  # In order of value, each capped; the deadline cuts the last ones first.
  bench decode 60 bench model "$model" --no-peer "${decode[@]}" "${dev_args[@]}"
  bench batching 60 bench batching "$model" --modes continuous "${batching[@]}" "${dev_args[@]}"
  bench prefill 45 bench model "$model" --no-peer "${prefill[@]}" "${dev_args[@]}"
  bench decode_q4k 60 bench model "$model" --no-peer --quantize q4_k "${decode[@]}" "${dev_args[@]}"
  bench longtail 90 bench batching "$model" --modes continuous,static --output-dist long-tail \
    "${longtail[@]}" "${dev_args[@]}"
  if "$python" scripts/gpu/check_report.py speed "$logs" "$model/config.json" "$logs/card.json" \
    --targets "$TARGETS" $enforce >"$logs/speed.txt" 2>&1; then
    record speed pass "$(tail -1 "$logs/speed.txt")"
  else
    record speed fail "$(tail -1 "$logs/speed.txt")"
  fi
  cat "$logs/speed.txt"
}

# ---- the run ----------------------------------------------------------------------------------
echo "GPU check: part $part, deadline ${deadline_s} s, device ${device:-none}, $pagoda$([ "$dry" = 1 ] && echo ", DRY RUN (CUDA interpreter)")"
# The seconds each step needs at least (else it is skipped), estimated: on a GPU (none has run
# this yet) and, for a dry run, measured in the interpreter on 2 cores.
if [ "$dry" = 1 ]; then needs=(5 60 20 60 30 30); else needs=(5 30 60 60 60 120); fi
#    name      needs        parts                  function
step devices "${needs[0]}" "all correctness speed" step_devices
step kernels "${needs[1]}" "all correctness" step_kernels
step logits "${needs[2]}" "all correctness" step_logits
step gpu-tests "${needs[3]}" "all correctness" step_gpu_tests
step quantized "${needs[4]}" "all correctness" step_quantized
step speed "${needs[5]}" "all speed" step_speed
finished=1
current_step=""
trap - TERM INT
write_summary
pack_logs
echo "== summary ($(elapsed) s of ${deadline_s}; $out: $(cd "$out" && echo *))"
cut -f1-4 "$out/steps.tsv" | awk -F'\t' '{printf "%-5s %-40s %5ss  %s\n", $2, $1, $3, substr($4, 1, 160)}'
if grep -q "$(printf '\tfail\t')" "$out/steps.tsv"; then
  echo FAIL
  exit 1
fi
echo "PASS$(grep -q "$(printf '\tskip\t')" "$out/steps.tsv" && echo ' (with skipped steps)')"
