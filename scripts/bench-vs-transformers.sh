#!/usr/bin/env bash
# Switchyard's host backend against the Python reference (transformers + peft on PyTorch CPU, f32
# weights), side by side in one run, with the same thread count and the same inputs: decode at
# batch 1 and 8, prefill of 128 tokens, the mixed-adapter batch (median of the rounds), and the
# front end (log-mel from WAV bytes, image crops from PNG bytes) when `phi4mm bench-frontend` and
# scripts/bench-vs-transformers/frontend.py exist. Writes the table into docs/benchmarks.md.
#
#   scripts/bench-vs-transformers.sh
#
# Environment: THREADS (default: all cores), ROUNDS (default 5), CKPT (the benchmark checkpoint,
# written once; default target/phi4mm-bench-ckpt), VENV (the reference's virtual environment,
# created once; default target/bench-vs-transformers-venv), CARGO_TARGET_DIR (honoured).
# Not part of CI: it downloads PyTorch with its CUDA runtime (about 4 GB) once and runs for
# several minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${THREADS:-$(nproc)}"
rounds="${ROUNDS:-5}"
ckpt="${CKPT:-target/phi4mm-bench-ckpt}"
venv="${VENV:-target/bench-vs-transformers-venv}"
target="${CARGO_TARGET_DIR:-target}"
here=scripts/bench-vs-transformers

# The pinned reference. PyPI serves torch for Linux only as the CUDA build: it does not import
# without its CUDA runtime wheels (about 3 GB more; a CPU run never uses them), so torch goes in
# with its dependencies. The packages that only depend on torch go in without theirs (pip would
# otherwise re-resolve torch), and what they need besides is named.
if ! "$venv/bin/python" -c "import torch, transformers, peft, soundfile, PIL" 2>/dev/null; then
    python3 -m venv "$venv"
    pip=("$venv/bin/pip" install -q)
    "${pip[@]}" torch==2.15.0
    "${pip[@]}" --no-deps torchvision==0.29.2 transformers==5.24.0 peft==0.21.2 accelerate
    "${pip[@]}" scipy huggingface-hub packaging pyyaml regex tokenizers safetensors tqdm psutil typer \
        soundfile pillow
fi
py="$venv/bin/python"

cargo build --release -p switchyard-phi4mm-cli --bin phi4mm
phi4mm="$target/release/phi4mm"
if [ ! -f "$ckpt/model.safetensors" ]; then
    "$phi4mm" bench-checkpoint --out "$ckpt" --force
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export RAYON_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads"
cat /proc/loadavg >"$out/load_before"
echo "switchyard: phi4mm bench" >&2
"$phi4mm" bench --model "$ckpt" --threads "$threads" --rounds 3 >"$out/bench.json"
echo "switchyard: phi4mm bench-batch ($rounds rounds)" >&2
"$phi4mm" bench-batch --model "$ckpt" --threads "$threads" --rounds "$rounds" >"$out/batch.json"
echo "reference: $here/decoder.py ($rounds rounds)" >&2
"$py" "$here/decoder.py" "$ckpt" --threads "$threads" --rounds "$rounds" >"$out/ref_decoder.json"
if "$phi4mm" bench-frontend --help >/dev/null 2>&1; then
    echo "switchyard: phi4mm bench-frontend" >&2
    "$phi4mm" bench-frontend --threads "$threads" --write-inputs "$out/inputs" >"$out/frontend.json"
fi
if [ -f "$here/frontend.py" ]; then
    echo "reference: $here/frontend.py" >&2
    "$py" "$here/frontend.py" --inputs "$out/inputs" --threads "$threads" >"$out/ref_frontend.json"
fi
cat /proc/loadavg >"$out/load_after"
python3 "$here/report.py" "$out" docs/benchmarks.md --threads "$threads" --rounds "$rounds"
