#!/usr/bin/env bash
# The project's test command: sets up the IREE toolchain, the CUDA headers and the MLX build
# (idempotent; see scripts/iree-env.sh, scripts/iree-cuda-env.sh and scripts/mlx-env.sh), builds
# every crate with the Phi4MM plugin's IREE backend (its CUDA driver included) and MLX producer
# enabled (the integration tests drive the real `switchyard` binary and the real plugin libraries,
# so those must exist first), then runs every test of the workspace.
#
# The features are those of scripts/test-features.sh, which CI's lint and doc passes use too, so
# that every pass shares one build of each dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test-features.sh
cargo build --workspace --all-targets "${test_features[@]}"
cargo test --workspace --no-fail-fast "${test_features[@]}" "$@"
