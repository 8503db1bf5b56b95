#!/usr/bin/env bash
# `make bench-sim`: the run in docs/bench.md, "The simulated stack". Starts the simulated stack
# (fast tier, precise tier, the gateway with config/tiergate.sim.yaml and a fresh key with
# high limits), runs `tiergate bench` direct and through the gateway, and stops it all.
# Ports: FAST_PORT (8101), PRECISE_PORT (8102), GATEWAY_PORT (8080). Output: OUT
# (bench/results/tiergate-bench-sim). Extra arguments go to `tiergate bench`.
# The simulators run with SIM_ARGS (default `--jitter 0`: exact latencies, so that the
# direct-vs-gateway difference is the gateway's, not the simulator's random draws).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
FAST_PORT=${FAST_PORT:-8101}
PRECISE_PORT=${PRECISE_PORT:-8102}
GATEWAY_PORT=${GATEWAY_PORT:-8080}
OUT=${OUT:-bench/results/tiergate-bench-sim}
read -r -a SIM_EXTRA <<< "${SIM_ARGS:---jitter 0}"
STATE=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$STATE"
}
trap cleanup EXIT INT TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$FAST_PORT" "$PRECISE_PORT" "$GATEWAY_PORT"; do
  if port_busy "$port"; then
    echo "bench-sim: port $port is in use (a demo?); set FAST_PORT/PRECISE_PORT/GATEWAY_PORT" >&2
    exit 1
  fi
done

"$BIN/tiergate" simulate --port "$FAST_PORT" --profile fast "${SIM_EXTRA[@]}" >"$STATE/sim-fast.log" 2>&1 &
PIDS+=($!)
"$BIN/tiergate" simulate --port "$PRECISE_PORT" --profile precise "${SIM_EXTRA[@]}" >"$STATE/sim-precise.log" 2>&1 &
PIDS+=($!)
export TIERGATE_KEYS_FILE="$STATE/keys.yaml"
TIERGATE_KEY=$("$BIN/tiergate" keys create --keys-file "$TIERGATE_KEYS_FILE" --name bench \
  --tenant bench --rpm 1000000 --tpm 1000000000 --concurrency 1024 | tail -n 1)
export TIERGATE_KEY
TIERGATE_FAST_URL="http://127.0.0.1:$FAST_PORT" TIERGATE_PRECISE_URL="http://127.0.0.1:$PRECISE_PORT" \
  "$BIN/tiergate" serve --config config/tiergate.sim.yaml --port "$GATEWAY_PORT" \
  >"$STATE/gateway.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$GATEWAY_PORT/readyz" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
if ! curl -fsS "http://127.0.0.1:$GATEWAY_PORT/readyz" >/dev/null 2>&1; then
  echo "bench-sim: the gateway did not become ready:" >&2
  tail -n 20 "$STATE/gateway.log" >&2
  exit 1
fi

GW="http://127.0.0.1:$GATEWAY_PORT"
"$BIN/tiergate" bench \
  --target "name=direct-fast,url=http://127.0.0.1:$FAST_PORT,model=tiergate-fast" \
  --target "name=gateway-fast,url=$GW,model=fast,vs=direct-fast,api-key-env=TIERGATE_KEY" \
  --target "name=direct-precise,url=http://127.0.0.1:$PRECISE_PORT,model=tiergate-precise" \
  --target "name=gateway-precise,url=$GW,model=precise,vs=direct-precise,api-key-env=TIERGATE_KEY" \
  --output-tokens short=32,long=128 \
  --concurrency 1,4,16 --num-requests 32 --rounds 2 --slo ttft_ms=300,tpot_ms=20 --out "$OUT" "$@"
