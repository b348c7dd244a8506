#!/usr/bin/env bash
# Router overhead and ABI call cost; writes its section of docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --exclude switchyard-phi4mm --exclude switchyard-phi4mm-cli
cargo bench -p switchyard-integration-tests --bench router_overhead
