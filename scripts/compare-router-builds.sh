#!/usr/bin/env bash
# Two builds of the router side by side: each build's release `switchyard serve` (echo plugin,
# token_delay_ms = 0, 256 slots) and its `router-baseline`, all four served at once and loaded in
# turn by oha (the order rotating every round), so that the machine's drift falls on all of them
# alike. Prints, per round and as medians, each build's throughput against its own baseline and
# the two builds against each other (the baselines against each other are the noise floor).
#
#   scripts/compare-router-builds.sh DIR_A DIR_B [CONCURRENCY] [ROUNDS] [SECS]
#
# DIR_A and DIR_B each hold `switchyard`, `libswitchyard_plugin_echo.so` and `router-baseline`
# (copies of target/release after `scripts/bench-router.sh` built them). Needs oha
# (scripts/bench-router.sh installs it under target/tools) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/router-bench-lib.sh
a=$(realpath "${1:?first build directory}")
b=$(realpath "${2:?second build directory}")
concurrency=${3:-64}
rounds=${4:-8}
secs=${5:-2}
oha=$(realpath "${OHA:-${CARGO_TARGET_DIR:-target}/tools/bin/oha}")
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
ports=()
for dir in "$a" "$b"; do
    port=$(free_port)
    echo_config "$port" "$dir" >"$work/$port.toml"
    XDG_CACHE_HOME=$work/cache "$dir/switchyard" serve --config "$work/$port.toml" \
        >"$work/$port.log" 2>&1 &
    pids+=($!)
    ports+=("$port")
done
for dir in "$a" "$b"; do
    port=$(free_port)
    "$dir/router-baseline" "127.0.0.1:$port" json >/dev/null 2>&1 &
    pids+=($!)
    ports+=("$port")
done
body=$ROUTER_BENCH_BODY
rps() {
    "$oha" --no-tui --output-format json -z "${2}s" -c "$concurrency" -m POST \
        -H 'content-type: application/json' -d "$body" \
        "http://127.0.0.1:$1/v1/chat/completions" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["summary"]["requestsPerSec"])'
}
for port in "${ports[@]}"; do
    wait_until_answering "$port" || true
    rps "$port" 1 >/dev/null # warm-up
done
: >"$work/rounds"
for round in $(seq "$rounds"); do
    declare -A got=()
    for i in 0 1 2 3; do
        slot=$(((i + round) % 4))
        got[$slot]=$(rps "${ports[$slot]}" "$secs")
    done
    echo "${got[0]} ${got[1]} ${got[2]} ${got[3]}" >>"$work/rounds"
    unset got
done
python3 - "$work/rounds" "$a" "$b" "$concurrency" "$rounds" "$secs" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, statistics, sys
path, a, b, c, rounds, secs, load = sys.argv[1:]
rows = [list(map(float, line.split())) for line in open(path)]
def med(f):
    return round(statistics.median(f(r) for r in rows), 3)
print("per round, A / its baseline:", " ".join(f"{r[0] / r[2]:.2f}" for r in rows))
print("per round, B / its baseline:", " ".join(f"{r[1] / r[3]:.2f}" for r in rows))
print(json.dumps({
    "bench": "compare-router-builds", "a": a, "b": b, "concurrency": int(c),
    "rounds": int(rounds), "phase_secs": float(secs), "load_avg_end": float(load),
    "a_rps": med(lambda r: r[0]), "b_rps": med(lambda r: r[1]),
    "a_over_its_baseline": med(lambda r: r[0] / r[2]),
    "b_over_its_baseline": med(lambda r: r[1] / r[3]),
    "a_over_b": med(lambda r: r[0] / r[1]),
    "baseline_a_over_baseline_b": med(lambda r: r[2] / r[3]),
}))
PY
