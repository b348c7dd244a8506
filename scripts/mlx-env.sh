#!/usr/bin/env bash
# Sets up what the Phi4MM plugin's `mlx` cargo feature needs on Linux, idempotently, and exports
# how cargo reaches it. Source it (`. scripts/mlx-env.sh`); the test command and CI do. macOS needs
# none of this (the published crates build there with Metal; see docs/phi4mm.md).
#
# - libclang (Debian's libclang-dev): bindgen, for mlx-sys's bindings;
# - a venv (.venv-mlx) with the prebuilt MLX of the PyPI wheel mlx-cpu==0.32.2 (libmlx.so, its
#   headers and CMake package; pinned exactly, MLX's C++ ABI is not stable) and cmake 3.31.10;
# - mlx-sys 0.7.0 as downloaded from crates.io, copied to a build-time directory outside the
#   repository (~/.cache/switchyard/) and adjusted there for Linux: its build script builds only
#   mlx-c against the wheel's MLX (mlx-c would fetch MLX sources from GitHub) and links it without
#   the macOS lines; `std::format` (g++ 12 has no <format>) becomes string concatenation; the half
#   typedefs, which mlx-c defines only on aarch64, are defined on x86 too; and a
#   `mach_approximate_time` shim is compiled for mlx-rs's RNG seed (a macOS-only symbol).
#
# Exports MLX_DIR and PHI4MM_MLX_LIB_DIR (the wheel's CMake package and lib directory: the
# plugin's build script sets the rpath of the final binaries to the latter), CMAKE, and
# PHI4MM_MLX_CARGO_CONFIG, a `--config` value that points cargo at the adjusted mlx-sys; pass it as
# `cargo build --config "$PHI4MM_MLX_CARGO_CONFIG" --features switchyard-phi4mm/mlx ...`.
_mlx_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_mlx_venv="${PHI4MM_MLX_VENV:-$_mlx_root/.venv-mlx}"
_mlx_version="0.32.2"
_mlx_cmake_version="3.31.10"
_mlx_sys_version="0.7.0"
# Bumped whenever the adjustments below change, so an older adjusted copy is rebuilt.
_mlx_patch_rev="2"

if ! ls /usr/lib/llvm-*/lib/libclang.so /usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so* >/dev/null 2>&1; then
  echo "mlx-env: installing libclang-dev" >&2
  if [ "$(id -u)" = 0 ]; then _sudo=""; else _sudo="sudo"; fi
  $_sudo apt-get install -y libclang-dev >/dev/null 2>&1 \
    || { $_sudo apt-get update >/dev/null && $_sudo apt-get install -y libclang-dev >/dev/null; }
fi

if [ ! -x "$_mlx_venv/bin/cmake" ] || ! "$_mlx_venv/bin/pip" show mlx-cpu 2>/dev/null \
    | grep -q "^Version: $_mlx_version"; then
  echo "mlx-env: creating $_mlx_venv (mlx-cpu $_mlx_version, cmake $_mlx_cmake_version)" >&2
  python3 -m venv "$_mlx_venv"
  "$_mlx_venv/bin/pip" install -q --disable-pip-version-check \
    "mlx-cpu==$_mlx_version" "cmake==$_mlx_cmake_version"
fi
_mlx_pkg="$(ls -d "$_mlx_venv"/lib/python3*/site-packages/mlx)"

# The registry copy: cargo downloads it on demand (`cargo fetch` of a throwaway manifest).
_mlx_registry_src() {
  ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/mlx-sys-"$_mlx_sys_version" 2>/dev/null | head -1
}
if [ -z "$(_mlx_registry_src)" ]; then
  echo "mlx-env: fetching mlx-sys $_mlx_sys_version from crates.io" >&2
  _mlx_fetch="$(mktemp -d)"
  mkdir -p "$_mlx_fetch/src" && : >"$_mlx_fetch/src/lib.rs"
  printf '[package]\nname = "mlx-sys-fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nmlx-sys = "=%s"\n' \
    "$_mlx_sys_version" >"$_mlx_fetch/Cargo.toml"
  (cd "$_mlx_fetch" && cargo fetch -q)
  rm -rf "$_mlx_fetch"
fi
_mlx_src="$(_mlx_registry_src)"
_mlx_sys="${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/mlx-sys-$_mlx_sys_version-linux-$_mlx_patch_rev"
if [ ! -f "$_mlx_sys/.adjusted" ]; then
  echo "mlx-env: adjusting a copy of mlx-sys $_mlx_sys_version for Linux in $_mlx_sys" >&2
  rm -rf "$_mlx_sys" && mkdir -p "$(dirname "$_mlx_sys")"
  cp -r "$_mlx_src" "$_mlx_sys"
  chmod -R u+w "$_mlx_sys"
  python3 "$_mlx_root/scripts/mlx-sys-linux.py" "$_mlx_sys"
  touch "$_mlx_sys/.adjusted"
fi

export MLX_DIR="$_mlx_pkg/share/cmake/MLX"
export PHI4MM_MLX_LIB_DIR="$_mlx_pkg/lib"
export CMAKE="$_mlx_venv/bin/cmake"
# A path override (not a [patch]): it swaps the source without rewriting Cargo.lock, so builds
# with and without the feature share one lock file.
export PHI4MM_MLX_CARGO_CONFIG="paths=[\"$_mlx_sys\"]"
unset -f _mlx_registry_src
unset _mlx_root _mlx_venv _mlx_version _mlx_cmake_version _mlx_sys_version _mlx_patch_rev \
  _mlx_pkg _mlx_src _mlx_sys _mlx_fetch _sudo
