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
# Phi4MM with the tiny fixture checkpoint: random weights, so the words are gibberish, but every
# request runs the real front end, encoders, per-row adapters and decoder.
FIX=tests/fixtures/phi4mm-tiny/inputs
IMG=$(base64 -w0 "$FIX/img_small.png")
WAV=$(base64 -w0 "$FIX/audio_16k.wav")
echo "--- Phi4MM: text"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"phi4mm","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"Hello"}]}'; echo
echo "--- Phi4MM: image (data URI)"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"phi4mm","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":[{"type":"text","text":"Describe the image."},{"type":"image_url","image_url":{"url":"data:image/png;base64,'"$IMG"'"}}]}]}'; echo
echo "--- Phi4MM: audio (input_audio)"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"phi4mm","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":[{"type":"text","text":"What is said?"},{"type":"input_audio","input_audio":{"data":"'"$WAV"'","format":"wav"}}]}]}'; echo
echo "--- Phi4MM: text with the speech LoRA pinned (model_options), 3 tokens with their logprobs and token ids"
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"phi4mm","max_tokens":3,"temperature":0,"logprobs":true,"top_logprobs":2,"return_tokens_as_token_ids":true,"model_options":{"adapter":"speech"},"messages":[{"role":"user","content":"Hello"}]}'; echo
echo "--- Phi4MM: /v1/audio/transcriptions"
curl -s "http://127.0.0.1:$PORT/v1/audio/transcriptions" -F model=phi4mm -F file=@"$FIX/audio_16k.wav"; echo
echo "--- GET /admin/status (admin listener)"
curl -s "http://127.0.0.1:$ADMIN_PORT/admin/status"; echo
