#!/usr/bin/env bash
# The GPU check of issues 21/23, run on the lent H200 machine (`run` of the device tool) from
# the repository root; results go under $OUT. That machine has CUDA, the driver, PyTorch and
# transformers but no Rust toolchain and no network, so it runs binaries built here:
#
#   cargo build --release -p pagoda-cli && strip -o target/gpu/pagoda target/release/pagoda
#   # then, with the device tool: carry target/gpu, run `scripts/gpu/check.sh`, timeout ~300 s
#
# What it checks so far (issue 21 is in progress; see its note):
#   1. `pagoda devices --json` finds the driver, NVRTC and cuBLAS by dynamic loading from a
#      binary built without a CUDA toolkit, and lists the GPU with its memory and compute
#      capability (written to $OUT/devices.json).
# Still to come with the CUDA forward pass: random-initialised SmolLM2-135M and
# Qwen2.5-1.5B-shaped checkpoints made here with transformers, Pagoda's logits against
# transformers' (top-1 agreement, max |logit difference|), batched == alone, the kernel
# tests, and the speed figures of issue 21.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$(mktemp -d)}"
pagoda="${PAGODA:-target/gpu/pagoda}"
[ -x "$pagoda" ] || { echo "no $pagoda: build and strip it here first (see the header)" >&2; exit 1; }
mkdir -p "$out"
# NVRTC and cuBLAS: the CUDA toolkit's, else the nvidia-*-cu12 wheels PyTorch brings.
libs="$(python3 -c 'import glob, site; print(":".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null || true)"
for d in /usr/local/cuda/lib64 $(echo "$libs" | tr ':' ' '); do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

echo "== devices"
"$pagoda" devices --json | tee "$out/devices.json"
python3 - "$out/devices.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
libs = report["cuda_libraries"]
assert all(libs.values()), f"CUDA libraries not all found: {libs} ({report['gpu_unavailable']})"
gpus = report["gpus"]
assert gpus, report["gpu_unavailable"]
for g in gpus:
    print(f"cuda:{g['ordinal']} {g['name']} {g['memory_bytes'] / 2**30:.1f} GiB "
          f"sm_{g['compute_capability'][0]}{g['compute_capability'][1]}")
PY
echo "== ok"
