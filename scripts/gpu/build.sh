#!/usr/bin/env bash
# Builds, here, what scripts/gpu/check.sh runs on the GPU machine, stripped, into target/gpu/:
#   target/gpu/pagoda                      the release CLI
#   target/gpu/pagoda_cuda_tests[_NAME]    the pagoda-cuda test executables (the kernel tests:
#                                            unit tests, _gpu, _quantized: every tests/*.rs
#                                            target cargo reports is picked up)
#   target/gpu/pagoda_model_it.xz          pagoda-model's and pagoda-engine's integration tests
#   target/gpu/pagoda_engine_it.xz           (their CUDA ones: the forward pass against the CPU,
#                                            batched == alone, the engine on CUDA), xz-packed
#   target/gpu/built_in                    the checkout they were built in (their tests find
#                                            tests/golden there: check.sh links it)
# and checks that the work tree plus target/gpu fit in what the device tool carries (64 MiB).
#
#   scripts/gpu/build.sh                   # release (15-40 min from cold on 2 cores)
#   GPU_BUILD_PROFILE=dev scripts/gpu/build.sh   # the dev profile, for check.sh --dry-run here
#
# Then, with the device tool, carry ["target/gpu"] and the two calls of check.sh's header
# (correctness, then speed). The scripts it runs (check.sh, check_report.py,
# make_checkpoint.py, compare_logits.py) travel with the work tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
profile="${GPU_BUILD_PROFILE:-release}"
dir="${CARGO_TARGET_DIR:-target}/$([ "$profile" = dev ] && echo debug || echo "$profile")"
mkdir -p target/gpu
rm -f target/gpu/pagoda target/gpu/pagoda_cuda_tests* target/gpu/*.xz
pwd > target/gpu/built_in

cargo build --profile "$profile" -p pagoda-cli
strip -o target/gpu/pagoda "$dir/pagoda"

# Each test executable of pagoda-cuda, as cargo reports it (the unit tests: pagoda_cuda_tests;
# an integration test target NAME: pagoda_cuda_tests_NAME).
cargo test --profile "$profile" -p pagoda-cuda --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        kinds = m["target"]["kind"]
        name = "pagoda_cuda_tests" if "lib" in kinds else "pagoda_cuda_tests_" + m["target"]["name"]
        print(name, m["executable"])
' | while read -r name exe; do
  strip -o "target/gpu/$name" "$exe"
  echo "target/gpu/$name <- $exe"
done

# The integration tests of the crates whose CUDA paths the device seam runs.
for crate in pagoda-model pagoda-engine; do
  exe=$(cargo test --profile "$profile" -p "$crate" --test it --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])
' | tail -1)
  name="${crate//-/_}_it"
  strip -o "target/gpu/$name" "$exe"
  xz -9 -f "target/gpu/$name"
  echo "target/gpu/$name.xz <- $exe"
done

ls -l target/gpu
tree_bytes=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
gpu_bytes=$(du -cb target/gpu | tail -1 | cut -f1)
total=$((tree_bytes + gpu_bytes))
echo "work tree $((tree_bytes / 1048576)) MiB + target/gpu $((gpu_bytes / 1048576)) MiB = $((total / 1048576)) MiB (the device tool carries at most 64)"
[ "$total" -le $((64 * 1048576)) ] || { echo "too large for the device tool" >&2; exit 1; }
