#!/usr/bin/env bash
# The `/metrics` scrape cost with 10 instances; prints one JSON line and writes its section of
# docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p switchyard -p switchyard-plugin-echo
cargo bench -p switchyard-integration-tests --bench metrics_scrape
