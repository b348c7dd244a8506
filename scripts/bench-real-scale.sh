#!/usr/bin/env bash
# Phi4MM at its real size, served the way users meet it (not part of CI: it writes an 11 GB
# checkpoint and needs about 16 GB of free memory).
#
#   scripts/bench-real-scale.sh
#
# 1. `phi4mm bench-checkpoint --preset phi4mm`: random bf16 weights with the released model's
#    dimensions (5.6 B parameters with both LoRAs, speech r 320, vision r 256), once, into REAL_CKPT
#    (default target/phi4mm-real-ckpt). The tokenizer is the fixture's small BPE with its special
#    tokens moved to the real ids (prompts below are given as token ids, so their lengths are exact).
# 2. `phi4mm bench` on it: read bandwidth, the bandwidth bound, batch-1 decode on each kernel path.
# 3. `switchyard serve` with the release plugin; load time (start to /ready) and, through real HTTP
#    (scripts/bench-real-scale/client.py): decode tokens/s at batch 1 and 8, time to first token of
#    a 1,000-token prompt, one 1344×896 image request, one 30 s audio request, one transcription,
#    and the server's peak RSS.
# Prints one JSON line. DELETE=1 removes the checkpoint afterwards. THREADS (default all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${REAL_CKPT:-target/phi4mm-real-ckpt}"
threads="${THREADS:-$(nproc)}"
target="${CARGO_TARGET_DIR:-target}"
port="${PORT:-18480}"
cargo build --release -p switchyard-phi4mm-cli --bin phi4mm
# Apart: with `--bin phi4mm` beside it, cargo would build no `switchyard` binary.
cargo build --release -p switchyard
# On its own: built beside the CLI (which links it as an rlib), cargo does not emit the plugin's
# cdylib.
cargo build --release -p switchyard-phi4mm
phi4mm="$target/release/phi4mm"
if [ ! -f "$dir/vision-lora/adapter_model.safetensors" ]; then
    t0=$(date +%s.%N)
    "$phi4mm" bench-checkpoint --preset phi4mm --out "$dir" --force >&2
    echo "checkpoint written in $(echo "$(date +%s.%N) - $t0" | bc) s" >&2
fi
python3 - "$dir" tests/fixtures/phi4mm-tiny/model <<'PY'
import json, sys, os
out, fix = sys.argv[1], sys.argv[2]
# The fixture's special tokens sit at 1000 + k; the real ones at 199999 (<|endoftext|>) and 199000 + k.
move = lambda i: 199999 if i == 1000 else i + 199000 if i > 1000 else i
tok = json.load(open(os.path.join(fix, "tokenizer.json")))
for a in tok["added_tokens"]:
    a["id"] = move(a["id"])
# The BPE vocabulary lists the special tokens too.
tok["model"]["vocab"] = {k: move(i) for k, i in tok["model"]["vocab"].items()}
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"))
tc = json.load(open(os.path.join(fix, "tokenizer_config.json")))
tc["added_tokens_decoder"] = {str(move(int(k))): v for k, v in tc["added_tokens_decoder"].items()}
json.dump(tc, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)
for f in ("processor_config.json",):
    open(os.path.join(out, f), "w").write(open(os.path.join(fix, f)).read())
PY

work="$(mktemp -d)"
trap 'kill "${server:-}" 2>/dev/null || true; wait "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
echo "phi4mm bench (in process)" >&2
"$phi4mm" bench --model "$dir" --threads "$threads" --prompt-tokens 16 --new-tokens 9 \
    --rounds 1 --long-context 0 >"$work/bench.json"
cat "$work/bench.json" >&2

# A 30 s 16 kHz clip and a 1344×896 PNG, made here.
python3 - "$work" <<'PY'
import math, struct, sys, wave, zlib, random
d = sys.argv[1]
w = wave.open(f"{d}/clip.wav", "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000)
w.writeframes(b"".join(struct.pack("<h", int(9000 * math.sin(2 * math.pi * (200 + 100 * i / 16000) * i / 16000))) for i in range(30 * 16000)))
w.close()
W, H = 1344, 896
rnd = random.Random(5)
raw = b"".join(b"\0" + bytes(v for x in range(W) for v in (x // 6 % 256, y // 4 % 256, rnd.randrange(256))) for y in range(H))
def chunk(t, b): return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))
open(f"{d}/image.png", "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
PY

cat >"$work/real.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$((port + 1))"
request_timeout_secs = 3600
max_body_bytes = 67108864

[[plugins]]
name = "phi4mm"
path = "$(realpath "$target/release/libswitchyard_phi4mm.so")"

[[models]]
name = "phi4mm-real"
plugin = "phi4mm"
kind = "phi4mm"
threads = $threads
settings = { checkpoint = "$(realpath "$dir")", slots = 8, max_queued = 16, default_max_tokens = 8 }
TOML
t0=$(date +%s.%N)
"$target/release/switchyard" serve --config "$work/real.toml" >"$work/server.log" 2>&1 &
server=$!
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
    sleep 0.2
done
load_s=$(echo "$(date +%s.%N) - $t0" | bc)
echo "ready after $load_s s" >&2
python3 scripts/bench-real-scale/client.py --base "http://127.0.0.1:$port" --model phi4mm-real \
    --pid "$server" --wav "$work/clip.wav" --png "$work/image.png" >"$work/client.json"
python3 - "$work" "$load_s" <<'PY'
import json, sys
d, load_s = sys.argv[1], float(sys.argv[2])
b = json.load(open(f"{d}/bench.json")); c = json.load(open(f"{d}/client.json"))
bound_tok_s = b["read_bandwidth_gb_s"] * 1e9 / b["weight_bytes_per_token"]
print(json.dumps({"load_to_ready_s": load_s, "bench": b, "served": c,
                  "served_batch1_fraction_of_bound": c["decode_batch1_tokens_per_s"] / bound_tok_s,
                  # A batch-8 step reads the weights once for all 8 rows.
                  "served_batch8_fraction_of_bound": c["decode_batch8_tokens_per_s"] / 8 / bound_tok_s,
                  "kv_bytes_per_position_per_row": b["kv_bytes_per_position"],
                  "kv_bytes_per_row_at": {n: n * b["kv_bytes_per_position"] for n in (4096, 32768)},
                  "load_average": open("/proc/loadavg").read().split()[:3]}))
PY
if [ "${DELETE:-0}" = 1 ]; then rm -rf "$dir"; fi
