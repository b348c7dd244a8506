# Source this (after scripts/iree-env.sh) to build the `cuda` feature. IREE's CUDA driver
# compiles against the CUDA headers (the driver API's, and through NCCL's the runtime's, `crt/`
# and CCCL's `nv/`), and its CMake also insists on finding the libdevice bitcode; it looks for
# both under IREE_CUDA_DEPS_DIR. They come from PyPI's nvidia-cuda-runtime-cu12 (include/),
# nvidia-cuda-nvcc-cu12 (include/crt/, nvvm/libdevice/) and nvidia-cuda-cccl-cu12 (include/nv/)
# wheels.
# Nothing from them is linked: the driver loads libcuda.so.1 when the device is created.
# Idempotent.
_cuda_here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_cuda_deps="$_cuda_here/target/iree-cuda-deps"
if [ ! -f "$_cuda_deps/include/nv/target" ] || [ ! -f "$_cuda_deps/nvvm/libdevice/libdevice.10.bc" ]; then
    _cuda_tmp="$(mktemp -d)"
    python3 -m pip download -q --no-deps -d "$_cuda_tmp" \
        nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86 \
        nvidia-cuda-cccl-cu12==12.9.27
    mkdir -p "$_cuda_deps"
    python3 - "$_cuda_tmp" "$_cuda_deps" <<'PY'
import glob, os, sys, zipfile
wanted = {  # prefix in a wheel -> folder under IREE_CUDA_DEPS_DIR
    "nvidia/cuda_runtime/include/": "include",
    "nvidia/cuda_nvcc/include/": "include",
    "nvidia/cuda_cccl/include/": "include",
    "nvidia/cuda_nvcc/nvvm/libdevice/": "nvvm/libdevice",
}
for wheel in glob.glob(os.path.join(sys.argv[1], "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            for prefix, folder in wanted.items():
                if name.startswith(prefix) and not name.endswith("/"):
                    out = os.path.join(sys.argv[2], folder, name[len(prefix):])
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    with open(out, "wb") as f:
                        f.write(z.read(name))
PY
    rm -rf "$_cuda_tmp"
    echo "iree-cuda-env: CUDA headers and libdevice in $_cuda_deps" >&2
fi
export IREE_CUDA_DEPS_DIR="$_cuda_deps"
unset _cuda_here _cuda_deps _cuda_tmp
