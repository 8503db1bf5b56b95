#!/usr/bin/env bash
# `make demo`: two simulated vLLM backends + the gateway on 127.0.0.1:8080, with a fresh key.
# Ctrl-C stops everything. Uses config/tiergate.sim.yaml, the same file as compose's sim profile.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
STATE=.demo
mkdir -p "$STATE"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in 8080 8101 8102; do
  if port_busy "$port"; then
    echo "demo: port $port is already in use; stop whatever listens there (an earlier demo?)" >&2
    exit 1
  fi
done

"$BIN/tiergate" simulate --port 8101 --profile fast --model tiergate-fast >"$STATE/sim-fast.log" 2>&1 &
PIDS+=($!)
"$BIN/tiergate" simulate --port 8102 --profile precise --model tiergate-precise >"$STATE/sim-precise.log" 2>&1 &
PIDS+=($!)

export TIERGATE_KEYS_FILE="$STATE/keys.yaml"
rm -f "$TIERGATE_KEYS_FILE"
KEY=$("$BIN/tiergate" keys create --keys-file "$TIERGATE_KEYS_FILE" --name demo --tenant demo \
      --rpm 600 --tpm 1000000 --scope route_override | tail -n 1)

"$BIN/tiergate" serve --config config/tiergate.sim.yaml >"$STATE/gateway.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
  if curl -fsS http://127.0.0.1:8080/readyz >/dev/null 2>&1; then break; fi
  sleep 0.2
done
if ! curl -fsS http://127.0.0.1:8080/readyz >/dev/null 2>&1; then
  echo "demo: the gateway did not become ready; see $STATE/gateway.log" >&2
  tail -n 20 "$STATE/gateway.log" >&2
  exit 1
fi

cat <<MSG

TierGate demo is up: gateway http://127.0.0.1:8080, simulated fast tier :8101, precise tier :8102.
Your API key (shown once; stored hashed in $TIERGATE_KEYS_FILE):

  export TIERGATE_KEY=$KEY

Try it with curl:

  curl -s http://127.0.0.1:8080/v1/chat/completions \\
    -H "Authorization: Bearer \$TIERGATE_KEY" -H 'Content-Type: application/json' \\
    -d '{"model": "auto", "messages": [{"role": "user", "content": "Hi there!"}]}' -i

Or with the official openai client:

  .venv/bin/python - <<'PY'
  import os, openai
  client = openai.OpenAI(base_url="http://127.0.0.1:8080/v1", api_key=os.environ["TIERGATE_KEY"])
  reply = client.chat.completions.with_raw_response.create(
      model="auto", messages=[{"role": "user", "content": "Write a Python function for the nth Bell number."}])
  print(reply.headers["x-tiergate-tier"], reply.headers["x-tiergate-route-reason"])
  print(reply.parse().choices[0].message.content)
  PY

Logs are in $STATE/. Press Ctrl-C to stop.
MSG
wait
