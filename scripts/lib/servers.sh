# Shared by the benchmark scripts (source it): checks that the binaries exist and waits for a
# server to answer. Every server checked here (pagoda serve, llama-server) serves /health and
# /v1/models once its model is loaded.

# require_pagoda PATH: exits with what to run when the release binary is missing.
require_pagoda() {
  [[ -x "$1" ]] || { echo "build pagoda first: cargo build --release -p pagoda-cli" >&2; exit 1; }
}

# require_llama_server PATH: exits with what to run when llama.cpp's server is missing.
require_llama_server() {
  [[ -x "$1" ]] || { echo "build llama-server first: scripts/reference/build_llama_server.sh" >&2; exit 1; }
}

# wait_ready URL [SECONDS]: returns once URL answers /health and /v1/models (default 180 s,
# model loads included), else fails with a message.
wait_ready() {
  local tries=$(( ${2:-180} * 5 ))
  for _ in $(seq "$tries"); do
    curl -sf "$1/health" >/dev/null 2>&1 && curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server at $1 did not become ready" >&2
  return 1
}
