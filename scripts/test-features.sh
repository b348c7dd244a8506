# Source this for what the test command builds with: it sets up the IREE toolchain, the CUDA
# headers and the MLX build (idempotent), and sets `test_features`, the cargo arguments of the
# test build: the `iree` (with its `cuda` driver) and `mlx` features of switchyard-phi4mm,
# switchyard-phi4mm-cli and switchyard-integration-tests. CI's clippy and doc passes take the
# same arguments: the same features mean one run of each build script (IREE's runtime and mlx-c
# through CMake) for every pass.
_tf_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$_tf_here/iree-env.sh"
. "$_tf_here/iree-cuda-env.sh"
. "$_tf_here/mlx-env.sh"
test_features=(--config "$PHI4MM_MLX_CARGO_CONFIG"
  --features switchyard-phi4mm/iree,switchyard-phi4mm-cli/iree,switchyard-integration-tests/iree
  --features switchyard-phi4mm/cuda,switchyard-phi4mm-cli/cuda
  --features switchyard-phi4mm/mlx,switchyard-phi4mm-cli/mlx,switchyard-integration-tests/mlx)
unset _tf_here
