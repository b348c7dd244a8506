#!/usr/bin/env bash
# The project's test command: builds every crate (the integration tests drive the real
# `switchyard` binary and the real plugin libraries, so those must exist first), then runs every
# test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast "$@"
