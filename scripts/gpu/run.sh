#!/usr/bin/env bash
# Runs on a CUDA machine, from a copy of this repository holding the folder that
# `scripts/gpu/pack.sh` wrote: the IREE suite on the GPU (`PHI4MM_TEST_IREE_DEVICE=cuda`), then
# `phi4mm bench-batch --backend both` on the benchmark checkpoint and on its real-dimension
# towers. Needs python3 (to unpack) and the NVIDIA driver; compiles nothing.
#
#   scripts/gpu/run.sh [PACK_DIR] [OUT_DIR]
#
# Writes machine.txt, tests.log, bench-batch.json, bench-towers.json and errors.log to OUT_DIR
# (default: $OUT where set, else gpu-out/).
set -uo pipefail
cd "$(dirname "$0")/../.."
pack="${1:-.gpu-pack}"
out="${2:-${OUT:-gpu-out}}"
mkdir -p "$out" /tmp/switchyard-gpu
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc;
  grep -m1 "model name" /proc/cpuinfo; cat /proc/loadavg; } 2>&1 | tee "$out/machine.txt"
python3 - "$pack" <<'PY'
import lzma, os, shutil, sys, tarfile
pack, bin_dir = sys.argv[1], "/tmp/switchyard-gpu"
for name in ["libIREECompiler.so", "iree-compile", "iree-lld", "phi4mm", "phi4mm-tests"]:
    with lzma.open(f"{pack}/{name}.xz") as f, open(f"{bin_dir}/{name}", "wb") as g:
        shutil.copyfileobj(f, g, 1 << 24)
    os.chmod(f"{bin_dir}/{name}", 0o755)
with tarfile.open(f"{pack}/caches.tar.xz") as t:
    t.extractall(".")
PY
# The test binary finds the fixture and its cache under the packing checkout's path.
root="$(cat "$pack/root")"
if [ "$root" != "$PWD" ] && [ ! -e "$root" ]; then
    mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"
fi
export PHI4MM_IREE_COMPILER=/tmp/switchyard-gpu/libIREECompiler.so
# IREE's CUDA driver loads the unversioned libcuda.so, which a driver-only install may lack.
if ! ldconfig -p | grep -q 'libcuda\.so '; then
    versioned="$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')"
    ln -sf "$versioned" /tmp/switchyard-gpu/libcuda.so
    export LD_LIBRARY_PATH=/tmp/switchyard-gpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
bin=/tmp/switchyard-gpu
(cd "$root" && PHI4MM_TEST_IREE_DEVICE=cuda timeout 240 "$bin/phi4mm-tests" \
    iree_backend:: iree_decoder:: iree_audio:: iree_vision:: iree_cuda::a_cuda) >"$out/tests.log" 2>&1
echo "tests: rc $?"; grep -E "^test |test result" "$out/tests.log"
"$bin/phi4mm" bench-checkpoint --out /tmp/switchyard-gpu/ck --force >/dev/null
"$bin/phi4mm" bench-checkpoint --out /tmp/switchyard-gpu/ckt --vision-layers 3 --audio-blocks 2 --force >/dev/null
bench() {
    timeout 150 "$bin/phi4mm" bench-batch --backend both --iree-device cuda --iree-cache-dir \
        "$pack/cache-bench" --threads "$(nproc)" --rounds 3 "$@"
}
bench --model /tmp/switchyard-gpu/ck >"$out/bench-batch.json" 2>"$out/errors.log"
echo "bench-batch: rc $?"; cat "$out/bench-batch.json"
bench --model /tmp/switchyard-gpu/ckt --encoders-only >"$out/bench-towers.json" 2>>"$out/errors.log"
echo "towers: rc $?"; cat "$out/bench-towers.json"
