#!/usr/bin/env bash
# `make demo`: two simulated vLLM backends + the gateway on 127.0.0.1:8080.
# Ctrl-C stops everything. Uses config/tiergate.sim.yaml, the same file as compose's sim profile.
# The demo key and an admin token are kept in .demo/ and shown again on every start.
# DEMO_STATE, DEMO_GATEWAY_PORT, DEMO_FAST_PORT and DEMO_PRECISE_PORT move the state directory
# and the ports (the README test runs the demo on free ports this way).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
STATE=${DEMO_STATE:-.demo}
GW_PORT=${DEMO_GATEWAY_PORT:-8080}
FAST_PORT=${DEMO_FAST_PORT:-8101}
PRECISE_PORT=${DEMO_PRECISE_PORT:-8102}
LABEL="[simulated reply: placeholder text, not a model]"
mkdir -p "$STATE"
chmod 700 "$STATE"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$GW_PORT" "$FAST_PORT" "$PRECISE_PORT"; do
  if port_busy "$port"; then
    echo "demo: port $port is already in use; stop whatever listens there (an earlier demo?)" >&2
    exit 1
  fi
done

"$BIN/tiergate" simulate --port "$FAST_PORT" --profile fast --model tiergate-fast \
  --label "$LABEL" >"$STATE/sim-fast.log" 2>&1 &
PIDS+=($!)
"$BIN/tiergate" simulate --port "$PRECISE_PORT" --profile precise --model tiergate-precise \
  --label "$LABEL" >"$STATE/sim-precise.log" 2>&1 &
PIDS+=($!)

export TIERGATE_KEYS_FILE="$STATE/keys.yaml"
export TIERGATE_ADMIN_TOKEN_FILE="$STATE/admin-token"
export TIERGATE_FAST_URL="http://127.0.0.1:$FAST_PORT"
export TIERGATE_PRECISE_URL="http://127.0.0.1:$PRECISE_PORT"
umask 077
if [[ -s "$STATE/demo-key" && -s "$TIERGATE_KEYS_FILE" ]]; then
  KEY=$(cat "$STATE/demo-key")
  KEY_NOTE="the same key as last time (kept in $STATE/demo-key; rm -r $STATE for a new one)"
else
  rm -f "$TIERGATE_KEYS_FILE"
  KEY=$("$BIN/tiergate" keys create --keys-file "$TIERGATE_KEYS_FILE" --name demo --tenant demo \
        --rpm 600 --tpm 1000000 --scope route_override | tail -n 1)
  printf '%s\n' "$KEY" >"$STATE/demo-key"
  KEY_NOTE="a new key, kept in $STATE/demo-key (stored hashed in $TIERGATE_KEYS_FILE)"
fi
if [[ ! -s "$TIERGATE_ADMIN_TOKEN_FILE" ]]; then
  "$BIN/python" -c 'import secrets; print("tg-admin-" + secrets.token_urlsafe(32))' \
    >"$TIERGATE_ADMIN_TOKEN_FILE"
fi
ADMIN=$(cat "$TIERGATE_ADMIN_TOKEN_FILE")

"$BIN/tiergate" serve --config config/tiergate.sim.yaml --port "$GW_PORT" \
  >"$STATE/gateway.log" 2>&1 &
PIDS+=($!)
URL="http://127.0.0.1:$GW_PORT"
for _ in $(seq 1 150); do
  if curl -fsS "$URL/readyz" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
if ! curl -fsS "$URL/readyz" >/dev/null 2>&1; then
  echo "demo: the gateway did not become ready; see $STATE/gateway.log" >&2
  tail -n 20 "$STATE/gateway.log" >&2
  exit 1
fi

cat <<MSG

TierGate demo is up: gateway $URL, simulated fast tier :$FAST_PORT, precise tier :$PRECISE_PORT.
The backends are simulators: every answer is placeholder text starting with
"$LABEL" (so structured-output helpers such as the openai client's
.parse() fail on it; routing, limits, streaming and errors behave as with vLLM).

Your API key, $KEY_NOTE:

  export TIERGATE_KEY=$KEY

Try it with curl:

  curl -s $URL/v1/chat/completions \\
    -H "Authorization: Bearer \$TIERGATE_KEY" -H 'Content-Type: application/json' \\
    -d '{"model": "auto", "messages": [{"role": "user", "content": "Hi there!"}]}' -i

Or with the official openai client:

  .venv/bin/python - <<'PY'
  import os, openai
  client = openai.OpenAI(base_url="$URL/v1", api_key=os.environ["TIERGATE_KEY"])
  reply = client.chat.completions.with_raw_response.create(
      model="auto", messages=[{"role": "user", "content": "Write a Python function for the nth Bell number."}])
  print(reply.headers["x-tiergate-tier"], reply.headers["x-tiergate-route-reason"])
  print(reply.parse().choices[0].message.content)
  PY

Admin token (kept in $TIERGATE_ADMIN_TOKEN_FILE) for the metrics and the admin API:

  export TIERGATE_ADMIN_TOKEN=$ADMIN
  curl -s $URL/metrics -H "Authorization: Bearer \$TIERGATE_ADMIN_TOKEN" | grep '^tiergate_requests'
  curl -s $URL/admin/backends -H "Authorization: Bearer \$TIERGATE_ADMIN_TOKEN"

Logs are in $STATE/. Press Ctrl-C to stop.
MSG
wait
