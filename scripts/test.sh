#!/usr/bin/env bash
# The project's test command: sets up the IREE toolchain (idempotent; see scripts/iree-env.sh),
# builds every crate with the Phi4MM plugin's IREE backend enabled (the integration tests drive the
# real `switchyard` binary and the real plugin libraries, so those must exist first), then runs
# every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/iree-env.sh
features=(--features switchyard-phi4mm/iree,switchyard-phi4mm-cli/iree,switchyard-integration-tests/iree)
cargo build --workspace --all-targets "${features[@]}"
cargo test --workspace --no-fail-fast "${features[@]}" "$@"
