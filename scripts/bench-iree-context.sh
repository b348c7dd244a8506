#!/usr/bin/env bash
# A short row's step cost on IREE against the context the decoder is compiled for (issue 13):
# the same 128-token prompt and 16 decode steps under decoders for 512, 4096 and 16384 positions.
# Each run compiles on a fresh artifact cache and prints bench-batch's JSON line.
# Usage: scripts/bench-iree-context.sh [CHECKPOINT] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ckpt=${1:-target/phi4mm-bench-ckpt}
rounds=${2:-1}
. scripts/iree-env.sh >/dev/null
cargo build --release -p switchyard-phi4mm-cli --features switchyard-phi4mm-cli/iree
[ -d "$ckpt" ] || ./target/release/phi4mm bench-checkpoint --out "$ckpt"
for context in 512 4096 16384; do
  echo "== context $context, load $(cut -d' ' -f1-3 /proc/loadavg)"
  ./target/release/phi4mm bench-batch --model "$ckpt" --backend iree --rounds "$rounds" \
    --iree-context "$context" 2>/dev/null | tail -1
done
