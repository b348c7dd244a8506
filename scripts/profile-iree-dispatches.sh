#!/usr/bin/env bash
# Where an IREE module's time goes, dispatch by dispatch: compiles a module that the plugin dumped
# (PHI4MM_IREE_DUMP_DIR) with the flags it was compiled with, has iree-compile write a benchmark
# for every executable (`--iree-hal-dump-executable-benchmarks-to`), times each with
# iree-benchmark-module, then times the whole function once with splat inputs. Prints a markdown
# table, slowest first.
#
#   PHI4MM_IREE_DUMP_DIR=/tmp/dump phi4mm bench-batch --model ... --backend iree ...
#   scripts/profile-iree-dispatches.sh /tmp/dump/<sha256>.mlir subsample [THREADS]
#
# Each dispatch runs alone, on warm caches and its own buffers, so the rows need not add up to
# the whole; they say which dispatches matter and how fast each one is. The data-tiling
# encodings (`__encoding_N`, packing an operand for the micro-kernels) are shared by every
# function of the module; they are listed with the function's own dispatches. Needs the venv of
# scripts/iree-env.sh; installs iree-base-runtime (its benchmark tool) there, at the compiler's
# version.
set -euo pipefail
mlir=$(realpath "${1:?the dumped <sha256>.mlir}")
function=${2:?a function of the module, e.g. subsample, window_w500, prefill_s216_base}
threads=${3:-2}
cd "$(dirname "$0")/.."
. scripts/iree-env.sh >/dev/null
flags_file=${mlir%.mlir}.flags
[ -f "$flags_file" ] || { echo "no $flags_file beside the MLIR (dumped by an older build?)" >&2; exit 2; }
mapfile -t flags <"$flags_file"
venv=${PHI4MM_IREE_VENV:-.venv-iree}
bench_tool=$venv/bin/iree-benchmark-module
if ! [ -x "$bench_tool" ]; then
    version=$("$venv/bin/pip" show iree-base-compiler | sed -n 's/^Version: //p')
    "$venv/bin/pip" install --quiet --disable-pip-version-check "iree-base-runtime==$version"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bench" "$work/vm"
"$venv/bin/iree-compile" "$mlir" "${flags[@]}" \
    --iree-hal-dump-executable-benchmarks-to="$work/bench" -o "$work/module.vmfb"

# real_time of one benchmark, in µs. The plugin's allocator puts large blocks in transparent huge
# pages (crates/phi4mm/src/huge_pages.rs); glibc's tunable does the same for the benchmark tool,
# without which a dispatch's timing includes faulting its buffers in, 4 KiB at a time. The
# warm-up keeps the first calls, which fault their buffers in even so, out of the figure: with
# none, a dispatch that writes 250 MB measured 490–560 ms in its one timed call, against 63–65
# ms per call once warm (2026-12-06).
time_us() {
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "$bench_tool" --device=local-task --task_topology_max_group_count="$threads" \
        --benchmark_min_warmup_time=1 --benchmark_min_time=0.5 "$@" 2>&1 |
        awk '/^BM_/ { v = $2; u = $3; if (u == "ms") v *= 1000; else if (u == "s") v *= 1e6; print v; exit }'
}

rows=$work/rows
: >"$rows"
for src in "$work"/bench/*_"${function}"_dispatch_*.mlir "$work"/bench/*__encoding_*.mlir; do
    [ -e "$src" ] || continue
    name=$(grep -o 'func.func @[A-Za-z0-9_]*' "$src" | head -1 | cut -d@ -f2)
    vmfb=$work/vm/$(basename "$src" .mlir).vmfb
    if ! "$venv/bin/iree-compile" "$src" "${flags[@]}" -o "$vmfb" 2>/dev/null; then
        echo "- | $name (its benchmark did not compile)" >>"$rows"
        continue
    fi
    echo "$(time_us --module="$vmfb") | $name" >>"$rows"
done

# Splat inputs for every argument of the function: 0.01 for floats, 1 for integers.
inputs=$(python3 - "$mlir" "$function" <<'PY'
import re, sys
text, name = open(sys.argv[1]).read(), sys.argv[2]
sig = re.search(r"func\.func @" + re.escape(name) + r"\((.*?)\) ->", text)
if not sig:
    sys.exit(f"no function @{name} in the module")
for ty in re.findall(r"tensor<([^>]*)>", sig.group(1)):
    *dims, elem = ty.split("x")
    print(f"--input={'x'.join(dims + [elem])}={'1' if elem.startswith('i') else '0.01'}")
PY
)
mapfile -t input_flags <<<"$inputs"
whole=$(time_us --module="$work/module.vmfb" --function="$function" "${input_flags[@]}")

echo "| µs | dispatch (alone, $threads threads) |"
echo "| ---: | --- |"
sort -t'|' -k1 -g -r "$rows" | sed 's/^/| /; s/$/ |/'
echo
echo "Whole \`$function\` with splat inputs: $whole µs ($(uptime | sed 's/.*load average: //') load)."
