#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind (repeatable on a noisy machine, where
# timings are not): a release `switchyard serve` (echo plugin, token_delay_ms = 0, 256 slots) or
# the `router-baseline` server, under callgrind; warmed, counters zeroed, then REQUESTS
# non-streaming chat requests from oha at concurrency 8, then a dump. Prints the instructions per
# request and writes `callgrind_annotate` (inclusive) of the dump beside it.
#
#   scripts/profile-router.sh switchyard|baseline [REQUESTS] [ECHO_SETTINGS]
#
# ECHO_SETTINGS (switchyard only) replaces the echo model's settings table, e.g.
# 'token_delay_ms = 0, slots = 256, pool = true'. Needs valgrind and the binaries that
# scripts/bench-router.sh builds (and its oha).
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:?switchyard or baseline}
requests=${2:-2000}
settings=${3:-token_delay_ms = 0, slots = 256}
target_dir=$(realpath "${CARGO_TARGET_DIR:-target}")
oha=${OHA:-$target_dir/tools/bin/oha}
out=$target_dir/profile
mkdir -p "$out"
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
case $which in
switchyard)
    cat >"$work/config.toml" <<TOML
[[plugins]]
name = "echo"
path = "$target_dir/release/libswitchyard_plugin_echo.so"
[[models]]
name = "bot"
plugin = "echo"
kind = "echo"
max_in_flight = 1024
settings = { $settings }
TOML
    cmd=("$target_dir/release/switchyard" serve --config "$work/config.toml" --listen "127.0.0.1:$port")
    ;;
baseline) cmd=("$target_dir/release/router-baseline" "127.0.0.1:$port") ;;
*) echo "switchyard or baseline, not $which" >&2; exit 2 ;;
esac
XDG_CACHE_HOME=$work/cache valgrind --tool=callgrind --callgrind-out-file="$out/$which.%p" \
    "${cmd[@]}" >"$work/log" 2>&1 &
pid=$!
body='{"model":"bot","messages":[{"role":"user","content":"the quick brown fox jumps over the lazy dog"}]}'
url=http://127.0.0.1:$port/v1/chat/completions
for _ in $(seq 600); do
    curl -sf -o /dev/null -H 'content-type: application/json' -d "$body" "$url" && break
    sleep 0.2
done
load() { "$oha" --no-tui -n "$1" -c 8 -m POST -H 'content-type: application/json' -d "$body" "$url" >/dev/null; }
load 500
callgrind_control -z "$pid" >/dev/null
load "$requests"
callgrind_control -d "$pid" >/dev/null
sleep 1
dump=$(ls -t "$out/$which.$pid".* | head -1)
total=$(sed -n 's/^summary: //p' "$dump")
callgrind_annotate --inclusive=yes "$dump" >"$out/$which.annotate.txt" 2>/dev/null || true
kill -INT "$pid"; wait "$pid" 2>/dev/null || true
echo "{\"profile\":\"$which\",\"settings\":\"$settings\",\"requests\":$requests,\"instructions\":$total,\"per_request\":$((total / requests))}"
echo "annotated: $out/$which.annotate.txt" >&2
