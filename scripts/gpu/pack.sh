#!/usr/bin/env bash
# Prepares everything the IREE suite and `bench-batch` need on a CUDA machine that has a GPU
# but no Rust toolchain, no IREE compiler and no network, and writes it into one folder (default
# `.gpu-pack/`, git-ignored) that `scripts/gpu/run.sh` uses there:
#
#   - the `phi4mm` tool and the phi4mm test binary, built here with `--features cuda`;
#   - the IREE compiler library, stripped and xz-compressed, and its `iree-compile` driver and
#     `iree-lld` linker: the GPU machine compiles nothing, but every module's cache key holds the
#     library's sha256 and the driver's `--version`, so the very files must be there, and the
#     plugin refuses a library without its tools;
#   - artifact caches warmed here with `phi4mm cache warm --iree-device cuda` (this machine needs
#     no GPU for it): the fixture's modules where the test binary looks for them, and the
#     benchmark checkpoints' at bench-batch's context (their weights are written there anew).
#
#   scripts/gpu/pack.sh [OUT_DIR]
#
# About 51 MB in all, most of it the compiler; a cold run compiles for several minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-.gpu-pack}"
. scripts/iree-env.sh
. scripts/iree-cuda-env.sh
mkdir -p "$out"
cargo build --release -p switchyard-phi4mm-cli --features cuda --bin phi4mm
tests="$(cargo test --release -p switchyard-phi4mm --features cuda --test phi4mm --no-run \
    --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "phi4mm" and m["profile"]["test"]:
        print(m["executable"])')"

# The library the caches are keyed by is the stripped copy that travels.
lib="$out/libIREECompiler.so"
strip -o "$lib" "$PHI4MM_IREE_COMPILER"
cp "$(dirname "$PHI4MM_IREE_COMPILER")/iree-compile" "$out/iree-compile"
cp "$(dirname "$PHI4MM_IREE_COMPILER")/iree-lld" "$out/iree-lld"
export PHI4MM_IREE_COMPILER="$PWD/$lib"
phi4mm=target/release/phi4mm
tmp=target/tmp
rm -rf "$tmp/iree-cache" "$out/cache-bench"
"$phi4mm" cache warm --model tests/fixtures/phi4mm-tiny/model --iree-device cuda \
    --iree-prefill-chunk 64 --iree-cache-dir "$tmp/iree-cache"
# Modules a few tests emit themselves: run them against the cache, which compiles them before
# they find no GPU here.
PHI4MM_TEST_IREE_DEVICE=cuda "$tests" iree_decoder::a_decode iree_decoder::both_mixed >/dev/null 2>&1 || true
[ -f target/phi4mm-bench-ckpt/model.safetensors ] || "$phi4mm" bench-checkpoint --out target/phi4mm-bench-ckpt --force
[ -f target/phi4mm-bench-ckpt-towers/model.safetensors ] \
    || "$phi4mm" bench-checkpoint --out target/phi4mm-bench-ckpt-towers --vision-layers 3 --audio-blocks 2 --force
for ckpt in target/phi4mm-bench-ckpt target/phi4mm-bench-ckpt-towers; do
    "$phi4mm" cache warm --model "$ckpt" --iree-device cuda --iree-context 152 --iree-cache-dir "$out/cache-bench"
done

xz -9 -T0 -f "$lib"
strip -o "$out/phi4mm" "$phi4mm"
strip -o "$out/phi4mm-tests" "$tests"
xz -9 -T0 -f "$out/phi4mm" "$out/phi4mm-tests" "$out/iree-compile" "$out/iree-lld"
# Where the test binary looks for its cache: this checkout's path, compiled in.
echo "$PWD" >"$out/root"
tar -cJf "$out/caches.tar.xz" "$tmp/iree-cache" "$out/cache-bench"
rm -rf "$out/cache-bench"
du -ch "$out"/* | tail -1
