#!/usr/bin/env bash
# The resident memory of a `switchyard serve` whose one instance is the Phi4MM fixture on the IREE
# backend: at /ready (modules loaded from the cache, compiled first if it is cold) and after one
# chat. Prints one JSON line, with how many of the server's mappings are the IREE compiler
# library (none since the compiler runs only as a child process). Compare builds by giving each
# its own BIN_DIR; the cache directory is shared, so the second build also shows whether its
# modules' cache keys match (it starts without compiling).
#
#   . scripts/iree-env.sh
#   scripts/iree-server-rss.sh [BIN_DIR (default target/release)] [PORT (default 18600)]
#
# BIN_DIR holds `switchyard` and `libswitchyard_phi4mm.so` (`cargo build --release -p switchyard`,
# then `cargo build --release -p switchyard-phi4mm --features iree`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(realpath "${1:-target/release}")"
port="${2:-18600}"
cache="${IREE_CACHE_DIR:-target/tmp/iree-server-rss-cache}"
mkdir -p "$cache" target/tmp
cfg="$(mktemp --suffix .toml)"
log="$(mktemp --suffix .log)"
cat >"$cfg" <<EOT
[[plugins]]
name = "phi4mm"
path = "$bin/libswitchyard_phi4mm.so"
[[models]]
name = "iree"
plugin = "phi4mm"
kind = "phi4mm"
settings = { checkpoint = "$PWD/tests/fixtures/phi4mm-tiny/model", slots = 2, default_max_tokens = 6, backend = "iree", iree = { cache_dir = "$(realpath "$cache")" } }
EOT
started=$(date +%s.%N)
"$bin/switchyard" serve --config "$cfg" --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$((port + 1))" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$cfg" "$log"' EXIT
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
done
ready_s=$(printf "%.3f" "$(echo "$(date +%s.%N) - $started" | bc)")
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$pid/status"; }
at_ready=$(rss)
reply=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"iree","max_tokens":6,"temperature":0,"messages":[{"role":"user","content":"Hello"}]}')
after_chat=$(rss)
maps=$(grep -c libIREECompiler "/proc/$pid/maps" || true)
compiled=$(grep -c "compiled .* in " "$log" || true)
echo "{\"bin\":\"$bin\",\"seconds_to_ready\":$ready_s,\"modules_compiled\":$compiled,\"rss_at_ready_kb\":$at_ready,\"rss_after_chat_kb\":$after_chat,\"compiler_library_mappings\":$maps,\"content\":$(echo "$reply" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["message"]["content"]))')}"
