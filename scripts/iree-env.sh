#!/usr/bin/env bash
# Sets up the IREE toolchain the `iree` cargo feature needs, idempotently, and exports where it
# is. Source it (`. scripts/iree-env.sh`); the test command and CI do.
#
# - libclang-dev (Debian): bindgen, for eerie-sys's vendored IREE runtime;
# - a venv (.venv-iree) with cmake 3.31.10 (Debian 12 has 3.25; the runtime needs >= 3.26) and
#   iree-base-compiler 3.13.0: libIREECompiler.so and the iree-compile driver beside it, which
#   the plugin runs (in a child process) to compile; the library's sha256 and the driver's
#   --version are part of every module's cache identity.
#
# Exports CMAKE (cmake-rs honours it) and PHI4MM_IREE_COMPILER (the compiler library).
_iree_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_iree_venv="${PHI4MM_IREE_VENV:-$_iree_root/.venv-iree}"
_iree_compiler_version="3.13.0"
_iree_cmake_version="3.31.10"

# libclang itself (libclang.so or libclang-N.so*), not libclang-cpp, which some images carry alone.
if ! ls /usr/lib/llvm-*/lib/libclang.so /usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so* >/dev/null 2>&1; then
  echo "iree-env: installing libclang-dev" >&2
  if [ "$(id -u)" = 0 ]; then _sudo=""; else _sudo="sudo"; fi
  $_sudo apt-get install -y libclang-dev >/dev/null 2>&1 \
    || { $_sudo apt-get update >/dev/null && $_sudo apt-get install -y libclang-dev >/dev/null; }
fi

_iree_lib="$_iree_venv/lib/python3.11/site-packages/iree/compiler/_mlir_libs/libIREECompiler.so"
# grep reads all of pip's output (no -q): under `set -o pipefail`, pip killed by SIGPIPE would
# fail the check and rebuild the venv every time.
if [ ! -x "$_iree_venv/bin/cmake" ] || ! "$_iree_venv/bin/pip" show iree-base-compiler 2>/dev/null \
    | grep "^Version: $_iree_compiler_version" >/dev/null; then
  echo "iree-env: creating $_iree_venv (cmake $_iree_cmake_version, iree-base-compiler $_iree_compiler_version)" >&2
  python3 -m venv "$_iree_venv"
  "$_iree_venv/bin/pip" install -q --disable-pip-version-check \
    "cmake==$_iree_cmake_version" "iree-base-compiler==$_iree_compiler_version"
fi
_iree_lib="$(ls "$_iree_venv"/lib/python3*/site-packages/iree/compiler/_mlir_libs/libIREECompiler.so)"

export CMAKE="$_iree_venv/bin/cmake"
export PHI4MM_IREE_COMPILER="$_iree_lib"
unset _iree_root _iree_venv _iree_compiler_version _iree_cmake_version _iree_lib _sudo
