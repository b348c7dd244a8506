# Source this to route the C and C++ that cargo's build scripts compile through CMake (IREE's
# runtime for eerie-sys, mlx-c for mlx-sys) through ccache, where ccache is installed. The test
# command builds those libraries once for `cargo clippy`/`cargo doc` and again for `cargo build`
# (cargo keeps a build script's output per compile mode, so each gets its own CMake tree);
# through ccache the second build takes the first one's objects. Without ccache this does
# nothing. Idempotent.
if command -v ccache >/dev/null; then
    export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
    # Each build-script run has its own directory under target/: paths under the checkout are
    # hashed relative to the compile's directory, so the same source compiled in two of those
    # trees is one cache entry.
    CCACHE_BASEDIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    export CCACHE_BASEDIR CCACHE_NOHASHDIR=1
fi
