#!/usr/bin/env bash
# The project's test command: sets up the IREE toolchain and the MLX build (idempotent; see
# scripts/iree-env.sh and scripts/mlx-env.sh), builds every crate with the Phi4MM plugin's IREE
# backend and MLX producer enabled (the integration tests drive the
# real `switchyard` binary and the real plugin libraries, so those must exist first), then runs
# every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/iree-env.sh
. scripts/mlx-env.sh
features=(--config "$PHI4MM_MLX_CARGO_CONFIG"
  --features switchyard-phi4mm/iree,switchyard-phi4mm-cli/iree,switchyard-integration-tests/iree
  --features switchyard-phi4mm/mlx,switchyard-phi4mm-cli/mlx,switchyard-integration-tests/mlx)
cargo build --workspace --all-targets "${features[@]}"
cargo test --workspace --no-fail-fast "${features[@]}" "$@"
