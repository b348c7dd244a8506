#!/usr/bin/env bash
# One matrix product as the IREE decoder emits it (`crates/phi4mm/src/iree/tiles.rs`): y = x · wᵀ
# with x [R, K] f32 packed into row tiles and w already in [⌈N/N0⌉, K, N0, 1] tiles, compiled
# with the plugin's CPU flags and timed alone with iree-benchmark-module on splat inputs.
# Prints GFLOP/s per shape and round, the shapes interleaved in each round, then each one's
# median over the rounds.
#
#   scripts/bench-iree-product.sh R N K WEIGHT_TYPE ROUNDS "M0xN0:VECTOR_ROWS[xVECTOR_COLS]:ROW_TILES[xWEIGHT_TILES] ..."
#
# WEIGHT_TYPE is bf16 (as stored) or f32. VECTOR_ROWS and ROW_TILES set the lowering config
# that `workgroup_config` writes (rows per vector tile, row tiles per workgroup); 0:0 leaves
# IREE's own. VECTOR_COLS (default N0) cuts a weight tile's columns into vector tiles of that
# many; WEIGHT_TILES (default 2) sets the weight tiles per workgroup. UKERNELS=1 adds the
# encoders' flags (IREE's data tiling and micro-kernels, `IreeCompiler::for_many_rows`).
# THREADS (2) sets the worker count. Example, a prefill chunk's gate/up product in AVX2's
# shapes, 8-row tiles in vector tiles of 4 (before 2026-12-06) against 6-row tiles:
#
#   scripts/bench-iree-product.sh 64 16384 3072 bf16 3 "8x16:4:8 6x16:6:11x1"
set -euo pipefail
R=$1 N=$2 K=$3 wt=$4 rounds=$5 specs=$6
cd "$(dirname "$0")/.."
. scripts/iree-env.sh >/dev/null
venv=${PHI4MM_IREE_VENV:-.venv-iree}
if ! [ -x "$venv/bin/iree-benchmark-module" ]; then
    version=$("$venv/bin/pip" show iree-base-compiler | sed -n 's/^Version: //p')
    "$venv/bin/pip" install --quiet --disable-pip-version-check "iree-base-runtime==$version"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
emit() { # M0 N0 VM[xVN] DIST[xWT]
    local m0=$(($1 < R ? $1 : R)) n0=$2 vm=${3%x*} vn=${3#*x} dist=${4%x*} wt_tiles=${4#*x}
    [ "$vn" != "$3" ] || vn=$n0
    [ "$wt_tiles" != "$4" ] || wt_tiles=2
    local m1=$(((R + m0 - 1) / m0)) n1=$(((N + n0 - 1) / n0)) cfg=""
    [ "$dist" = 0 ] || cfg="{compilation_info = #iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<distribution = [$dist, $wt_tiles, 0, 0, 0, 0], vector_common_parallel = [1, 1, 0, $vm, $vn, 0], vector_reduction = [0, 0, 1, 0, 0, 1]>, translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<Mmt4dTilingExpert>>>}"
    cat <<MLIR
func.func @prod(%x: tensor<${R}x${K}xf32>, %w: tensor<${n1}x${K}x${n0}x1x${wt}>) -> tensor<${R}x$((n1 * n0))xf32> {
  %z = arith.constant 0.0 : f32
  %ex = tensor.empty() : tensor<${m1}x${K}x${m0}x1xf32>
  %xp = linalg.pack %x padding_value(%z : f32) inner_dims_pos = [0, 1] inner_tiles = [${m0}, 1] into %ex : tensor<${R}x${K}xf32> -> tensor<${m1}x${K}x${m0}x1xf32>
  %eo = tensor.empty() : tensor<${m1}x${n1}x${m0}x${n0}xf32>
  %acc = linalg.fill ins(%z : f32) outs(%eo : tensor<${m1}x${n1}x${m0}x${n0}xf32>) -> tensor<${m1}x${n1}x${m0}x${n0}xf32>
  %p = linalg.mmt4d${cfg} ins(%xp, %w : tensor<${m1}x${K}x${m0}x1xf32>, tensor<${n1}x${K}x${n0}x1x${wt}>) outs(%acc : tensor<${m1}x${n1}x${m0}x${n0}xf32>) -> tensor<${m1}x${n1}x${m0}x${n0}xf32>
  %ey = tensor.empty() : tensor<${R}x$((n1 * n0))xf32>
  %y = linalg.unpack %p inner_dims_pos = [0, 1] inner_tiles = [${m0}, ${n0}] into %ey : tensor<${m1}x${n1}x${m0}x${n0}xf32> -> tensor<${R}x$((n1 * n0))xf32>
  return %y : tensor<${R}x$((n1 * n0))xf32>
}
MLIR
}
for s in $specs; do
    IFS=: read -r t vm dist <<<"$s"
    emit "${t%x*}" "${t#*x}" "$vm" "$dist" >"$work/$s.mlir"
    # The plugin's flags for CPU modules (`CompileTarget::flags` in crates/phi4mm/src/iree/compiler.rs).
    "$venv/bin/iree-compile" "$work/$s.mlir" --iree-hal-target-device=local \
        --iree-hal-local-target-device-backends=llvm-cpu --iree-llvmcpu-target-cpu=host \
        --iree-llvmcpu-reassociate-fp-reductions=true \
        ${UKERNELS:+--iree-opt-data-tiling --iree-llvmcpu-enable-ukernels=all} -o "$work/$s.vmfb"
done
for r in $(seq "$rounds"); do
    line="$R×$N×$K $wt, round $r:"
    for s in $specs; do
        IFS=: read -r t _ _ <<<"$s"
        n0=${t#*x}
        # Huge pages for the tool's buffers, as the plugin's allocator gives them
        # (crates/phi4mm/src/huge_pages.rs); otherwise the time includes faulting them in.
        time=$(GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "$venv/bin/iree-benchmark-module" \
            --device=local-task --task_topology_max_group_count="${THREADS:-2}" \
            --benchmark_min_time=0.5 --module="$work/$s.vmfb" --function=prod \
            --input="${R}x${K}xf32=0.01" --input="$(((N + n0 - 1) / n0))x${K}x${n0}x1x${wt}=0.01" 2>&1 |
            awk '/^BM_/ {print $2 $3; exit}')
        gflops=$(python3 -c "t='$time'; v=float(t.rstrip('mus')); v = v/1e3 if t.endswith('us') else v; print(round(2*$R*$N*$K/v/1e6))")
        line="$line $s=$time (${gflops} GFLOP/s)"
        echo "$s $gflops" >>"$work/gflops"
    done
    echo "$line (load $(cut -d' ' -f1 /proc/loadavg))"
done
# One round here moves by ±15 % or more on a shared machine: the medians are what to compare.
for s in $specs; do
    echo "$s median $(awk -v s="$s" '$1 == s {print $2}' "$work/gflops" | sort -n |
        awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}') GFLOP/s"
done
