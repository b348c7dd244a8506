#!/usr/bin/env bash
# Benchmark of the Phi4MM host backend on the model issue's config (text hidden 1024,
# intermediate 2816, 8 layers, 16 heads, 4 KV heads, vocab 200064, tied embeddings, partial rotary
# 0.75) with random bf16 weights.
#
#   scripts/phi4mm-bench.sh [CHECKPOINT_DIR] [extra `phi4mm bench` args...]
#
# Writes the random checkpoint (about 590 MB) to CHECKPOINT_DIR (default target/phi4mm-bench-ckpt)
# if it is not there yet, then prints one JSON line: read bandwidth, GEMM GFLOP/s on 64x1024x1024,
# time to first token for a 128-token prompt, batch-1 decode tokens/s over 32 new tokens, and the
# fraction of the bandwidth bound (weight bytes per token / read bandwidth) the decode reaches.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/phi4mm-bench-ckpt}"
shift || true
cargo build --release -p switchyard-phi4mm-cli --bin phi4mm
if [ ! -f "$dir/model.safetensors" ]; then
    ./target/release/phi4mm bench-checkpoint --out "$dir" --force
fi
./target/release/phi4mm bench --model "$dir" "$@"
