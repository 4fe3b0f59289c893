#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the peer of `pagoda bench batching`) from the llama.cpp
# source vendored in the llama-cpp-python sdist, so the peer is the same llama.cpp version as
# the llama-cpp-python references. CPU only, native ISA (AMX off where the CPU has it),
# Release. Never committed. LLAMA_SERVER_CMAKE_ARGS replaces the ISA flags.
#
#   scripts/reference/build_llama_server.sh        # -> $PAGODA_PEER_DIR/bin/llama-server
#
# Environment: PAGODA_PEER_DIR (default ~/.cache/pagoda/peer), LLAMA_CPP_PYTHON_VERSION
# (default 0.3.36), JOBS (default: number of cores). Idempotent: exits at once if built.
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
peer_dir="${PAGODA_PEER_DIR:-$HOME/.cache/pagoda/peer}"
bin="$peer_dir/bin/llama-server"
jobs="${JOBS:-$(nproc)}"
venv="${PAGODA_REF_VENV:-/root/.venvs/pagoda-ref}"

if [[ -x "$bin" ]]; then
    echo "llama-server already built: $bin"
    exit 0
fi
mkdir -p "$peer_dir/src" "$peer_dir/bin"

sdist=$(ls "$peer_dir"/src/llama_cpp_python-"$version".tar.gz 2>/dev/null || true)
if [[ -z "$sdist" ]]; then
    echo "downloading the llama-cpp-python $version sdist"
    python3 -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$peer_dir/src"
    sdist="$peer_dir/src/llama_cpp_python-$version.tar.gz"
fi
src="$peer_dir/src/llama_cpp_python-$version"
[[ -d "$src" ]] || tar xzf "$sdist" -C "$peer_dir/src"
llama="$src/vendor/llama.cpp"

cmake_bin=$(command -v cmake || true)
if [[ -z "$cmake_bin" ]]; then
    if [[ -x "$venv/bin/cmake" ]]; then
        cmake_bin="$venv/bin/cmake"
    else
        echo "installing cmake with pip"
        python3 -m pip install --quiet cmake
        cmake_bin=$(command -v cmake || echo "$(python3 -m site --user-base)/bin/cmake")
    fi
fi

# On a CPU with AMX the native build segfaults at the first decode (setup.sh); build with
# everything else the CPU has (AVX-512, VNNI, BF16, weight repacking) and AMX off there.
isa_args="-DGGML_NATIVE=ON"
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    isa_args="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
      -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF \
      -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CPU_REPACK=ON"
fi
isa_args="${LLAMA_SERVER_CMAKE_ARGS:-$isa_args}"

build="$peer_dir/build"
# shellcheck disable=SC2086 # isa_args is a list of flags
"$cmake_bin" -S "$llama" -B "$build" -DCMAKE_BUILD_TYPE=Release $isa_args \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF
"$cmake_bin" --build "$build" --target llama-server -j "$jobs"
cp "$build/bin/llama-server" "$bin"
echo "built $bin"
