#!/usr/bin/env bash
# Router overhead against a minimal axum server, measured with the third-party load generator
# oha, plus the ABI call cost; writes its section of docs/benchmarks.md and prints one JSON line.
# Environment: CARGO_TARGET_DIR (default target), TOOLS_DIR (where oha is installed, default
# $CARGO_TARGET_DIR/tools), ROUTER_BENCH_ROUNDS (3), ROUTER_BENCH_PHASE_SECS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
OHA_VERSION=1.16.0
target_dir=${CARGO_TARGET_DIR:-target}
tools_dir=${TOOLS_DIR:-$target_dir/tools}
oha=$tools_dir/bin/oha
if ! [ -x "$oha" ] || [ "$("$oha" --version)" != "oha $OHA_VERSION" ]; then
    cargo install oha --version "$OHA_VERSION" --locked --root "$tools_dir"
fi
cargo build --release -p switchyard -p switchyard-plugin-echo
cargo build --release -p switchyard-integration-tests --bin router-baseline
OHA=$(realpath "$oha") cargo bench -p switchyard-integration-tests --bench router_overhead
