#!/usr/bin/env bash
# Server CPU time per request, with the server pinned to one core and the load generator to the
# other, so that neither competes for the other's core and cross-core traffic is out of the
# figure: on a 2-core machine this is steadier than throughput, whose ratio moves by ±0.1 from
# run to run. Serves each build's `switchyard serve` (echo plugin, token_delay_ms = 0, 256 slots)
# and `router-baseline`, all at once, and loads them in turn (rounds interleaved), reading each
# server's user + system time from /proc/<pid>/stat before and after.
#
#   scripts/router-cpu-per-request.sh DIR... [-- ROUNDS REQUESTS CONCURRENCY]
#
# Each DIR holds `switchyard` and `libswitchyard_plugin_echo.so` (target/release after
# scripts/bench-router.sh); the baseline is the first DIR's `router-baseline` if it has one,
# else target/release/router-baseline. Needs oha (scripts/bench-router.sh installs it), taskset
# and python3. Prints one line per round and server, then a JSON line of medians.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/router-bench-lib.sh
dirs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    dirs+=("$(realpath "$1")")
    shift
done
[ "${1:-}" = "--" ] && shift
rounds=${1:-4}
requests=${2:-150000}
concurrency=${3:-64}
[ ${#dirs[@]} -gt 0 ] || { echo "usage: $0 DIR... [-- ROUNDS REQUESTS CONCURRENCY]" >&2; exit 2; }
[ "$(nproc)" -ge 2 ] || { echo "needs 2 cores" >&2; exit 2; }
oha=$(realpath "${OHA:-${CARGO_TARGET_DIR:-target}/tools/bin/oha}")
baseline_bin=${dirs[0]}/router-baseline
[ -x "$baseline_bin" ] || baseline_bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/router-baseline")
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
names=() ports=() servers=()
for dir in "${dirs[@]}"; do
    port=$(free_port)
    echo_config "$port" "$dir" >"$work/$port.toml"
    XDG_CACHE_HOME=$work/cache taskset -c 1 "$dir/switchyard" serve --config "$work/$port.toml" \
        >"$work/$port.log" 2>&1 &
    pids+=($!) servers+=($!) ports+=("$port") names+=("$dir")
done
port=$(free_port)
taskset -c 1 "$baseline_bin" "127.0.0.1:$port" json >/dev/null 2>&1 &
pids+=($!) servers+=($!) ports+=("$port") names+=(baseline)
body=$ROUTER_BENCH_BODY
for port in "${ports[@]}"; do
    wait_until_answering "$port" || true
done
ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
: >"$work/rows"
for round in $(seq "$rounds"); do
    for i in "${!ports[@]}"; do
        before=$(cpu_ticks "${servers[$i]}")
        ok=$(taskset -c 0 "$oha" --no-tui --output-format json -n "$requests" -c "$concurrency" \
            -m POST -H 'content-type: application/json' -d "$body" \
            "http://127.0.0.1:${ports[$i]}/v1/chat/completions" |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["statusCodeDistribution"].get("200", 0))')
        after=$(cpu_ticks "${servers[$i]}")
        us=$(python3 -c "print(round(($after - $before) / $ticks * 1e6 / $requests, 2))")
        echo "round $round ${names[$i]}: $us us of server CPU per request ($ok of $requests answered 200)"
        echo "${names[$i]} $us" >>"$work/rows"
    done
done
python3 - "$work/rows" "$rounds" "$requests" "$concurrency" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import collections, json, statistics, sys
path, rounds, requests, concurrency, load = sys.argv[1:]
per = collections.defaultdict(list)
for line in open(path):
    name, us = line.rsplit(" ", 1)
    per[name].append(float(us))
med = {name: statistics.median(v) for name, v in per.items()}
print(json.dumps({
    "bench": "router-cpu-per-request", "rounds": int(rounds), "requests": int(requests),
    "concurrency": int(concurrency), "load_avg_end": float(load),
    "cpu_us_per_request": {k: round(v, 2) for k, v in med.items()},
    "over_baseline": {k: round(v / med["baseline"], 3) for k, v in med.items() if k != "baseline"},
}))
PY
