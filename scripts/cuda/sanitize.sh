#!/usr/bin/env bash
# pagoda-cuda's kernel tests (tests/gpu.rs, tests/quantized.rs) in the CUDA interpreter, with the
# interpreter and the kernels built under sanitizers (build.rs' PAGODA_CUDA_INTERPRET_SANITIZE):
#
#   scripts/cuda/sanitize.sh asan   # AddressSanitizer + UndefinedBehaviorSanitizer: an
#                                   # out-of-bounds access, a misaligned or overflowing
#                                   # operation in a kernel or in the host driver/cuBLAS code
#                                   # fails the run (scripts/test.sh runs this)
#   scripts/cuda/sanitize.sh asan --quick   # the same without the two exhaustive attention
#                                   # sweeps (every other test: all kernels, split decode and
#                                   # merge, the FP8 writes)
#   scripts/cuda/sanitize.sh tsan   # ThreadSanitizer: each CUDA thread an OS thread, so a
#                                   # missing __syncthreads()/__syncwarp() between a shared
#                                   # memory write and another thread's read is a race report
#
# Each builds in its own target folder (target/sanitize-asan, target/sanitize-tsan; the
# sanitizer flags change only the interpreter's C++, but the cfg would otherwise rebuild the
# normal one) and runs the test executables with PAGODA_CUDA_INTERPRET=1 and the sanitizer's
# runtime preloaded: the Rust test binary is not instrumented, the interpreter it loads is, and
# the runtime must be the first library loaded. Extra arguments go to the test executables
# (a test name filter, --test-threads N).
#
# The tests have no size knob: they run their usual shapes. Measured on this project's 2-core
# machine (shared with other builds; cold build of the deps through sccache ~1 CPU-minute, the
# interpreter's C++ under ASan ~30-40 s): asan 51 s of tests (the two attention sweeps are
# most of it; --quick 6 s); tsan: too slow for the whole suite (an OS thread per CUDA thread:
# a 391-block launch is 100,000 threads; its first test had not finished after 12 minutes):
# name the tests, e.g. `scripts/cuda/sanitize.sh tsan embed kv_write`.
set -euo pipefail
cd "$(dirname "$0")/../.."

kind="${1:-asan}"
shift || true
if [ "${1:-}" = --quick ]; then
  shift
  set -- --skip paged_attention_matches_the_cpu --skip fp8_paged_attention_matches_the_cpu "$@"
fi
case "$kind" in
asan)
  sanitize=address,undefined
  runtime=libasan.so
  # Rust's host side is not instrumented and keeps some allocations for the life of the
  # process (the interpreter's library handles): no leak check. Stop at the first finding.
  export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  ;;
tsan)
  sanitize=thread
  runtime=libtsan.so
  # Rust's own synchronisation (futexes, atomics in uninstrumented code) is invisible to TSan,
  # which then reports the test harness's channels as races: ignore what uninstrumented code
  # does through TSan's interceptors (memcpy, calloc) and run one test at a time, so the reports
  # are what the interpreter's threads and the kernels do among themselves.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:ignore_noninstrumented_modules=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
  set -- --test-threads 1 "$@"
  ;;
*)
  echo "usage: $0 [asan|tsan] [--quick] [test filter and harness arguments]" >&2
  exit 2
  ;;
esac

cxx="${CXX:-c++}"
preload="$("$cxx" -print-file-name="$runtime")"
[ -f "$preload" ] || {
  echo "no $runtime for $cxx (install the compiler's sanitizer runtime, e.g. libasan8 / libtsan2)" >&2
  exit 1
}
export CARGO_TARGET_DIR="${SANITIZE_TARGET_DIR:-$PWD/target/sanitize-$kind}"
export PAGODA_CUDA_INTERPRET_SANITIZE="$sanitize"

echo "== build (pagoda-cuda's tests, interpreter with -fsanitize=$sanitize, in $CARGO_TARGET_DIR)"
t0=$(date +%s)
exes=$(cargo test -p pagoda-cuda --test gpu --test quantized --no-run --message-format=json |
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])
')
t1=$(date +%s)
echo "built in $((t1 - t0)) s"

status=0
for exe in $exes; do
  echo "== $(basename "$exe") under $kind"
  # TSan maps its shadow at fixed addresses, which a high-entropy ASLR layout can overlap:
  # run without address randomisation when setarch can.
  wrap=()
  if [ "$kind" = tsan ] && setarch "$(uname -m)" -R true 2>/dev/null; then
    wrap=(setarch "$(uname -m)" -R)
  fi
  if ! "${wrap[@]}" env PAGODA_CUDA_INTERPRET=1 LD_PRELOAD="$preload" "$exe" "$@"; then
    echo "FAILED under $kind: $(basename "$exe")" >&2
    status=1
  fi
done
t2=$(date +%s)
echo "== $kind: $([ "$status" = 0 ] && echo clean || echo FINDINGS) (build $((t1 - t0)) s, tests $((t2 - t1)) s)"
exit "$status"
