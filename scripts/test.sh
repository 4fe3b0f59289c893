#!/usr/bin/env bash
# The project's test command (README, second command; `.ci/run` calls it).
#
# 1. Builds the workspace and checks formatting and lints.
# 2. Pulls the real models the golden tests need (from their PyPI packages, through
#    `pagoda pull`, into a store under target/) and points the tests at them.
# 3. Runs every test. Tests that need a real model fail (not skip) when CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export PAGODA_HOME="${PAGODA_TEST_STORE:-$PWD/target/test-store}"

# The disk this runs on is shared: say how much was free, so that a "No space left on device"
# below can be told apart from a test that writes too much.
echo "== disk free at start: $(df -h --output=avail "$PWD" | tail -1 | tr -d ' ')"
echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

echo "== build"
cargo build --workspace --all-targets

echo "== models for the golden tests (store: $PAGODA_HOME)"
PAGODA=target/debug/pagoda
for m in smollm2:135m gemma3:270m all-minilm qwen2.5-coder:0.5b; do
  "$PAGODA" pull "$m"
done
PAGODA_TEST_SMOLLM2="$("$PAGODA" show --path smollm2:135m)"
PAGODA_TEST_GEMMA3="$("$PAGODA" show --path gemma3:270m)"
PAGODA_TEST_MINILM="$("$PAGODA" show --path all-minilm)"
export PAGODA_TEST_SMOLLM2 PAGODA_TEST_GEMMA3 PAGODA_TEST_MINILM

echo "== a newcomer's first minutes: the README's first command from a clean store, and what it prints"
# `pagoda serve` with its own empty store pulls the default model as a new user's does (pip's
# cache, filled by the pull above, makes it quick); checks the answer and stderr: no warning,
# one line for the pulled file, nothing of pip, no GPU line without a driver, one bar on a pty.
python3 scripts/conformance/newcomer.py --pagoda "$PAGODA"

echo "== llama.cpp's tokenizer test vectors (models/ggml-vocab-* of the llama-cpp-python 0.3.36 sdist)"
# The sdist (76 MB, its SHA-256 checked) is fetched once into target/llama-vocab; only the
# ggml-vocab-* files (a vocabulary-only GGUF and its .inp/.out vectors per tokenizer family)
# are extracted. `--no-binary llama-cpp-python`, not `:all:`: the latter builds cmake from
# source for the metadata step. pagoda-model's tests/it/ggml_vocab.rs reads the files; under
# CI a missing folder fails them.
vocab_dir="$PWD/target/llama-vocab"
vocab_sdist="$vocab_dir/sdist/llama_cpp_python-0.3.36.tar.gz"
vocab_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
mkdir -p "$vocab_dir"
if [ ! -e "$vocab_dir/ggml-vocab-qwen35.gguf.out" ]; then
  { [ -e "$vocab_sdist" ] \
      || python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary llama-cpp-python --dest "$vocab_dir/sdist" llama-cpp-python==0.3.36; } \
    && echo "$vocab_sha256  $vocab_sdist" | sha256sum --check --quiet \
    && tar -xzf "$vocab_sdist" -C "$vocab_dir" --strip-components=4 --wildcards \
      'llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*' \
    || [ "${CI:-}" != "true" ] || { echo "fetching llama.cpp's ggml-vocab files failed (remove $vocab_dir to fetch again)" >&2; exit 1; }
fi
if [ -e "$vocab_dir/ggml-vocab-qwen35.gguf.out" ]; then
  export PAGODA_TEST_LLAMA_VOCAB="$vocab_dir"
fi

echo "== API conformance: the official openai and ollama Python clients against pagoda serve"
# gguf (gguf-py, llama.cpp's own GGUF library): security.py writes a GGUF whose chat template
# is a bomb with its gguf-new-metadata.
clients="openai ollama websocket-client langchain-openai jsonschema gguf"
if ! python3 -c "import openai, ollama, websocket, langchain_openai, jsonschema, gguf" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check $clients \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages $clients
fi
python3 scripts/conformance/clients.py --pagoda "$PAGODA" --model smollm2:135m --embed-model all-minilm
echo "== a mixture of experts end to end: tiny Qwen3-MoE, the openai client, streaming, n=2, a tool call"
python3 scripts/conformance/moe_serve.py --pagoda "$PAGODA"
echo "== a hybrid end to end: tiny Qwen3.5-MoE, the same checks, a tool call in Qwen3.5's markup"
python3 scripts/conformance/moe_serve.py --pagoda "$PAGODA" --family qwen35moe
echo "== gpt-oss end to end: tiny gpt-oss, a harmony template, the same checks (a forced call in the JSON form)"
python3 scripts/conformance/moe_serve.py --pagoda "$PAGODA" --family gpt-oss
echo "== tools and structured output: openai, ollama and LangChain clients against Qwen2.5-Coder-0.5B"
python3 scripts/conformance/tools.py --pagoda "$PAGODA" --model qwen2.5-coder:0.5b --validity 50
echo "== agent loops: the catalog's tool model (Qwen2.5-Coder-1.5B) through the openai client, 2 tools, 5 questions"
# Needs 4 of 5 loops to end in an answer that states the tool's result (docs/benchmarks.md,
# "Agent loops"). Costs a 1.1 GB pull (22 PyPI chunks, about 70 s) and about 1-2.5 min of loops
# in the debug build. Under CI a failed pull fails the run; elsewhere it skips with a message.
if "$PAGODA" pull qwen2.5-coder:1.5b; then
  python3 scripts/conformance/agent_loop.py --pagoda "$PAGODA" --model qwen2.5-coder:1.5b --min-finished 4
elif [ "${CI:-}" = "true" ]; then
  echo "pulling qwen2.5-coder:1.5b (the agent-loop check's model) failed" >&2
  exit 1
else
  echo "skipped: pulling qwen2.5-coder:1.5b failed"
fi
echo "== gateway: pagoda serve behind two pagoda gateway processes, the openai client, the keys CLI"
python3 scripts/conformance/gateway.py --pagoda "$PAGODA" --model smollm2:135m
echo "== many replicas as one system: 3 servers, 2 gateways, Redis, each in its own network namespace"
python3 scripts/conformance/multi_host.py --pagoda "$PAGODA" --model smollm2:135m
echo "== object storage: pagoda pull s3://... against moto's S3 server on loopback (boto3 fills the bucket)"
if ! python3 -c "import moto.server, boto3, flask_cors" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check "moto[server]" boto3 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "moto[server]" boto3
fi
python3 scripts/conformance/object_store.py --pagoda "$PAGODA"
echo "== security probes: paths and URLs as models, pulls and redirects, stalled clients, deep JSON, grammar and template bombs, forged turns, leaks (serve and gateway)"
python3 scripts/conformance/security.py --pagoda "$PAGODA" --model smollm2:135m
echo "== deployment artefacts: promtool rules and alert tests, Kubernetes schemas, dashboard metrics"
if command -v promtool >/dev/null 2>&1 && python3 -c "import kubernetes_validate" 2>/dev/null; then
  python3 scripts/check_deploy.py --pagoda "$PAGODA"
elif [ "${CI:-}" = "true" ]; then
  echo "promtool or kubernetes-validate is missing (.ci/run installs them)" >&2
  exit 1
else
  echo "skipped: apt-get install prometheus; pip install kubernetes-validate"
fi
echo "== chat page (models, Markdown, injection, stop, settings, storage) and blind comparison page in headless Chromium"
if command -v chromium >/dev/null 2>&1; then
  python3 scripts/conformance/chat_page.py --pagoda "$PAGODA" --model smollm2:135m --embed-model all-minilm
  python3 scripts/conformance/compare_page.py --pagoda "$PAGODA"
elif [ "${CI:-}" = "true" ]; then
  echo "chromium is missing (.ci/run installs it)" >&2
  exit 1
else
  echo "skipped: install chromium (apt-get install chromium) to run the chat page test"
fi

echo "== SVG plots (eval report, bench serve, docs/img) drawn in headless Chromium: titles and tick labels inside, axes ticked and titled"
if command -v chromium >/dev/null 2>&1; then
  python3 scripts/conformance/svg_plots.py --pagoda "$PAGODA"
elif [ "${CI:-}" = "true" ]; then
  echo "chromium is missing (.ci/run installs it)" >&2
  exit 1
else
  echo "skipped: install chromium (apt-get install chromium) to run the SVG plot test"
fi

echo "== NVRTC (the nvidia-cuda-nvrtc-cu12 wheel: compiles CUDA kernels without a GPU)"
nvrtc_dir="$PWD/target/nvrtc"
if [ ! -e "$nvrtc_dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$nvrtc_dir" nvidia-cuda-nvrtc-cu12 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
      --target "$nvrtc_dir" nvidia-cuda-nvrtc-cu12 \
    || [ "${CI:-}" != "true" ] || { echo "installing NVRTC failed" >&2; exit 1; }
fi
export LD_LIBRARY_PATH="$nvrtc_dir/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== ptxas gate: every kernel through NVRTC and ptxas of CUDA 12 and of CUDA 13, for sm_80 and sm_90"
# Fails on spills, a stack frame beyond rope's sincosf allowance, or static shared memory over
# 48 KiB; installs the nvcc (ptxas) and CUDA 13 NVRTC wheels under target/cuda-gate (under CI
# a missing wheel fails, elsewhere it skips with a message).
python3 scripts/cuda/ptxas_gate.py

echo "== CUDA kernels in the CUDA interpreter under ASan+UBSan (scripts/cuda/sanitize.sh asan)"
# Its own target folder (target/sanitize-asan); a finding fails the run (~1 min of tests on 2
# cores). The TSan run is a command of its own (too slow: an OS thread per CUDA thread).
if [ -f "$(${CXX:-c++} -print-file-name=libasan.so 2>/dev/null)" ]; then
  scripts/cuda/sanitize.sh asan
elif [ "${CI:-}" = "true" ]; then
  echo "no ASan runtime for ${CXX:-c++} (apt-get install g++ brings libasan)" >&2
  exit 1
else
  echo "skipped: no ASan runtime for ${CXX:-c++}"
fi

# The GPU tests run in the CUDA interpreter (pagoda_cuda::interpret): the kernels' CUDA C
# compiled for the host, the driver, NVRTC and cuBLAS calls answered on the CPU, the same Rust
# launch code. Under CI a GPU test that would skip fails instead. The interpreter compiles the
# kernels with the real NVRTC above; one more run of the kernel tests uses its own.
export PAGODA_CUDA_INTERPRET=1
gpu_tests='package(pagoda-cuda) | (package(pagoda-model) & test(/cuda/))
  | (package(pagoda-engine) & test(/cuda|split_between/)) | (package(pagoda-cli) & test(/cuda/))'

echo "== tests"
# The runner's summary must be the last thing printed (no doc-test run after it: there are
# no doc tests, and its "0 passed" would end the log).
if command -v cargo-nextest >/dev/null 2>&1; then
  echo "== GPU tests in the CUDA interpreter (kernels compiled by the real NVRTC)"
  cargo nextest run --workspace --no-fail-fast -E "$gpu_tests"
  echo "== the kernel tests again with the interpreter's own NVRTC"
  PAGODA_CUDA_INTERPRET_NVRTC=builtin cargo nextest run -p pagoda-cuda --no-fail-fast \
    --test gpu --test quantized
  echo "== every other test (disk free: $(df -h --output=avail "$PWD" | tail -1 | tr -d ' '))"
  cargo nextest run --workspace --no-fail-fast -E "not ($gpu_tests)"
else
  cargo test --workspace --no-fail-fast
fi
