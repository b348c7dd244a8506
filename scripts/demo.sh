#!/usr/bin/env bash
# Builds Switchyard and the demo plugins, starts `switchyard serve --config config/demo.toml`,
# sends it a few requests, then stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace
PORT=${PORT:-8080}
ADMIN_PORT=${ADMIN_PORT:-8081}
./target/debug/switchyard serve --config config/demo.toml \
  --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break
  sleep 0.1
done
echo "--- GET /v1/models"
curl -s "http://127.0.0.1:$PORT/v1/models"; echo
echo "--- POST /v1/chat/completions (non-streaming)"
curl -s -i "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"assistant","messages":[{"role":"user","content":"Hello from the Switchyard demo"}]}'; echo
echo "--- POST /v1/chat/completions (streaming, with usage)"
curl -sN "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"assistant","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"streamed token by token"}]}'
echo "--- GET /admin/status (admin listener)"
curl -s "http://127.0.0.1:$ADMIN_PORT/admin/status"; echo
