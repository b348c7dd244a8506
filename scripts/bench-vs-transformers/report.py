"""Writes the side-by-side table of scripts/bench-vs-transformers.sh into docs/benchmarks.md
(between its markers, replacing the previous run) from the JSON lines the run left in DIR.

    python3 report.py DIR docs/benchmarks.md --threads N --rounds R
"""

import argparse
import datetime
import json
import os

START = "<!-- bench-vs-transformers:start -->"
END = "<!-- bench-vs-transformers:end -->"


def load(d, name):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    lines = [l for l in open(p).read().splitlines() if l.strip().startswith("{")]
    return json.loads(lines[-1]) if lines else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("doc")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    a = ap.parse_args()
    bench = load(a.dir, "bench.json")
    batch = load(a.dir, "batch.json")
    ref = load(a.dir, "ref_decoder.json")
    fe = load(a.dir, "frontend.json")
    ref_fe = load(a.dir, "ref_frontend.json")
    host = batch["host"]

    rows = []

    def rate(work, r, s, goal):
        rows.append(f"| {work} | {r:.1f} tok/s | {s:.1f} tok/s | {s / r:.2f}× | {goal} |")

    rate("decode, batch 1 (benchmark config)", ref["decode_tokens_per_s_batch1"],
         bench["decode_tokens_per_s"], "≥ 1.5×")
    rate("decode, batch 8", ref["decode_tokens_per_s_batch8"],
         host["decode_tokens_per_s_batch8"], "≥ 1.5×")
    rate("prefill, 128 tokens", ref["prefill_tokens_per_s"], host["prefill_tokens_per_s"], "≥ 2.5×")
    rows.append(
        "| mixed adapters, batch 8 (3 base / 3 speech r32 / 2 vision r24) vs base-only, "
        f"median of {a.rounds} rounds | peft `adapter_names`: {ref['mixed_extra_time_median'] * 100:+.1f} % "
        f"| {host['mixed_extra_time_median'] * 100:+.1f} % | — | ≤ +5 % |"
    )
    labels = [
        ("logmel_30s_16k_wav_ms", "log-mel, 30 s 16 kHz, from the WAV bytes", "≥ 5×"),
        ("logmel_30s_44k_wav_ms", "log-mel, 30 s 44.1 kHz, from the WAV bytes", "—"),
        ("image_1344x896_png_ms", "image 1344×896, from the PNG bytes → crops", "≥ 3×"),
        ("image_1344x896_rgb_ms", "image 1344×896, from decoded RGB → crops", "—"),
    ]
    for key, work, goal in labels:
        if fe and ref_fe and key in fe and key in ref_fe:
            rows.append(f"| {work} | {ref_fe[key]:.1f} ms | {fe[key]:.1f} ms | {ref_fe[key] / fe[key]:.2f}× | {goal} |")
        else:
            rows.append(f"| {work} | (not run) | (not run) | — | {goal} |")

    # The compute bound of prefill, from `phi4mm bench` (absent from runs before it measured one).
    prefill_bound = ""
    if "peak_gflops" in bench:
        unit = bench["peak_vector_path"]
        if unit == "amx":
            unit = "amx: the tiles' bf16 rate ÷ 3, for an f32 product is three tile products"
        prefill_bound = (
            f" Prefill in `phi4mm bench` at {bench['prefill_gflops']:.0f} GFLOP/s, "
            f"**{bench['prefill_fraction_of_peak']:.2f}** of the peak throughput measured in "
            f"the same run ({bench['peak_gflops']:.0f} GFLOP/s, {unit})."
        )
    load_before = open(os.path.join(a.dir, "load_before")).read().split()[:3]
    load_after = open(os.path.join(a.dir, "load_after")).read().split()[:3]
    today = datetime.date.today().isoformat()
    text = f"""{START}
## Side by side with the Python reference (issue 16)

Command: `scripts/bench-vs-transformers.sh` (THREADS={a.threads}, ROUNDS={a.rounds}). It runs
`phi4mm bench`, `phi4mm bench-batch` and the reference (`scripts/bench-vs-transformers/decoder.py`:
transformers {ref['transformers']} `Phi3ForCausalLM` with the benchmark config, f32 weights loaded
from the same bf16 checkpoint, peft {ref['peft']} with both adapters and per-row `adapter_names`,
PyTorch {ref['torch']} CPU, capability `{ref['cpu_capability']}`), one after the other, each with
{a.threads} threads, then the front-end pair when both sides exist.

Run of {today}: {bench['machine']['cpu']}, {a.threads} threads; switchyard kernel path
**{bench['kernel_path']}**; load average {' '.join(load_before)} before, {' '.join(load_after)}
after (1/5/15 min). Batch-1 decode at **{bench['fraction_of_bandwidth_bound']:.2f}** of the
bandwidth bound measured in the same run ({bench['read_bandwidth_gb_s']:.1f} GB/s read,
{bench['weight_bytes_per_token'] / 1e6:.0f} MB per token).{prefill_bound} Rates: best of the rounds;
the mixed-adapter figure: the median of the rounds' (mixed ÷ base-only − 1).

| work | Python reference | switchyard | ratio | goal |
| --- | ---: | ---: | ---: | ---: |
""" + "\n".join(rows) + f"""

Switchyard's mixed-adapter rounds: {', '.join(f'{x * 100:+.1f} %' for x in host['mixed_extra_time_rounds'])};
the reference's: {', '.join(f'{x * 100:+.1f} %' for x in ref['mixed_extra_time_rounds'])}.
{END}"""
    doc = open(a.doc).read()
    if START in doc:
        doc = doc[: doc.index(START)] + text + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    open(a.doc, "w").write(doc)
    print(text)


if __name__ == "__main__":
    main()
