#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind (repeatable on a noisy machine, where
# timings are not): a release `switchyard serve` (echo plugin, token_delay_ms = 0, 256 slots) or
# the `router-baseline` server, under callgrind; warmed, counters zeroed, then REQUESTS
# non-streaming chat requests at concurrency 8 (8 keep-alive connections of Python's
# http.client; the server is the bottleneck under callgrind), then a dump. Prints the
# instructions per request and writes `callgrind_annotate` (inclusive) of the dump beside it.
#
#   scripts/profile-router.sh switchyard|baseline|baseline-typed [REQUESTS] [ECHO_SETTINGS]
#
# baseline-typed is the baseline serialising its answer from typed structs, as the host does,
# instead of building a serde_json::Value.
# ECHO_SETTINGS (switchyard only) replaces the echo model's settings table, e.g.
# 'token_delay_ms = 0, slots = 256, pool = true'. Needs valgrind, python3 and the release
# binaries that scripts/bench-router.sh builds. BIN_DIR (default $CARGO_TARGET_DIR/release)
# names another directory holding `switchyard` and the echo plugin (an older build, to compare).
# CACHE_SIM=1 also simulates the caches (32 KiB 8-way L1i and L1d, a 512 KiB 8-way last level,
# 64-byte lines) and prints each miss count per request beside the instructions.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:?switchyard, baseline or baseline-typed}
requests=${2:-2000}
settings=${3:-token_delay_ms = 0, slots = 256}
target_dir=$(realpath "${CARGO_TARGET_DIR:-target}")
bin_dir=$(realpath "${BIN_DIR:-$target_dir/release}")
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
path = "$bin_dir/libswitchyard_plugin_echo.so"
[[models]]
name = "bot"
plugin = "echo"
kind = "echo"
max_in_flight = 1024
settings = { $settings }
TOML
    cmd=("$bin_dir/switchyard" serve --config "$work/config.toml" --listen "127.0.0.1:$port")
    ;;
baseline) cmd=("$target_dir/release/router-baseline" "127.0.0.1:$port") ;;
baseline-typed) cmd=("$target_dir/release/router-baseline" "127.0.0.1:$port" typed) ;;
*) echo "switchyard, baseline or baseline-typed, not $which" >&2; exit 2 ;;
esac
cache_sim=()
if [ "${CACHE_SIM:-0}" = 1 ]; then
    cache_sim=(--cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=524288,8,64)
fi
XDG_CACHE_HOME=$work/cache valgrind --tool=callgrind "${cache_sim[@]}" \
    --callgrind-out-file="$out/$which.%p" "${cmd[@]}" >"$work/log" 2>&1 &
pid=$!
body='{"model":"bot","messages":[{"role":"user","content":"the quick brown fox jumps over the lazy dog"}]}'
url=http://127.0.0.1:$port/v1/chat/completions
for _ in $(seq 600); do
    curl -sf -o /dev/null -H 'content-type: application/json' -d "$body" "$url" && break
    sleep 0.2
done
load() {
    python3 - "$port" "$1" "$body" <<'PY'
import http.client, sys, threading
port, total, body = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
def client(n):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(n):
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200, reply.status
        reply.read()
threads = [threading.Thread(target=client, args=(total // 8,)) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
PY
}
load 500
callgrind_control -z "$pid" >/dev/null
load "$requests"
requests=$((requests / 8 * 8))
callgrind_control -d "$pid" >/dev/null
sleep 1
dump=$(ls -t "$out/$which.$pid".* | head -1)
# Without the cache simulation the summary is the instruction count alone.
read -r -a counts <<<"$(sed -n 's/^summary: //p' "$dump")"
read -r -a events <<<"$(sed -n 's/^events: //p' "$dump")"
total=${counts[0]}
callgrind_annotate --inclusive=yes "$dump" >"$out/$which.annotate.txt" 2>/dev/null || true
# The baseline has no signal handler of its own; under valgrind it may not die of SIGINT.
kill -INT "$pid"
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
kill -KILL "$pid" 2>/dev/null || true
per_request=""
for i in "${!events[@]}"; do
    per_request+=",\"${events[$i]}\":$(python3 -c "print(round(${counts[$i]} / $requests, 1))")"
done
echo "{\"profile\":\"$which\",\"settings\":\"$settings\",\"requests\":$requests,\"instructions\":$total,\"per_request\":$((total / requests)),\"per_request_events\":{${per_request#,}}}"
echo "annotated: $out/$which.annotate.txt" >&2
