#!/usr/bin/env python3
"""The Python reference side of `phi4mm bench-frontend`: the same four timings on the same inputs.

    phi4mm bench-frontend --threads 2 --write-inputs DIR     # switchyard, and writes the inputs
    python frontend.py --inputs DIR --threads 2              # the reference on those files

Prints one JSON line with the keys `phi4mm bench-frontend` prints (medians over interleaved
rounds, milliseconds):

- logmel_30s_16k_wav_ms: WAV bytes -> soundfile -> Phi4MultimodalFeatureExtractor
- logmel_30s_44k_wav_ms: WAV bytes -> soundfile -> scipy.signal.resample_poly(x, 160, 441)
  (the extractor accepts only 16 kHz; this is what a transformers caller does, and what
  switchyard's default `polyphase` mode reproduces) -> Phi4MultimodalFeatureExtractor
- image_1344x896_png_ms: PNG bytes -> PIL (decode, RGB) -> Phi4MultimodalImageProcessorFast
- image_1344x896_rgb_ms: the decoded PIL image -> Phi4MultimodalImageProcessorFast

Both processors are built with their defaults, which are Phi-4-multimodal-instruct's
(80 mel bands, 16 kHz, dynamic_hd 36, 448-pixel crops); torch.set_num_threads(--threads).
"""

import argparse
import io
import json
import os
import statistics
import time

import numpy as np
import PIL.Image
import scipy.signal
import soundfile
import torch
import transformers
from transformers import Phi4MultimodalFeatureExtractor, Phi4MultimodalImageProcessorFast

WAV_16K = "speech_30s_16k.wav"
WAV_44K = "speech_30s_44k.wav"
PNG = "photo_1344x896.png"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", required=True, help="directory written by --write-inputs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    def read(name):
        with open(os.path.join(args.inputs, name), "rb") as f:
            return f.read()

    wav16, wav44, png = read(WAV_16K), read(WAV_44K), read(PNG)
    extractor = Phi4MultimodalFeatureExtractor()
    processor = Phi4MultimodalImageProcessorFast()

    def logmel(wav):
        audio, rate = soundfile.read(io.BytesIO(wav))
        if rate != 16000:
            g = np.gcd(16000, rate)
            audio = scipy.signal.resample_poly(audio, 16000 // g, rate // g)
        out = extractor(audio, sampling_rate=16000, return_tensors="pt")
        return out["audio_input_features"].shape

    def decode(data):
        return PIL.Image.open(io.BytesIO(data)).convert("RGB")

    rgb = decode(png)

    def from_png():
        return processor(images=decode(png), return_tensors="pt")["image_pixel_values"].shape

    def from_rgb():
        return processor(images=rgb, return_tensors="pt")["image_pixel_values"].shape

    work = [
        ("logmel_30s_16k_wav_ms", lambda: logmel(wav16)),
        ("logmel_30s_44k_wav_ms", lambda: logmel(wav44)),
        ("image_1344x896_png_ms", from_png),
        ("image_1344x896_rgb_ms", from_rgb),
    ]
    shapes = {key: list(f()) for key, f in work}  # untimed warm-up round
    times = {key: [] for key, _ in work}
    for _ in range(args.rounds):
        for key, f in work:
            start = time.perf_counter()
            f()
            times[key].append((time.perf_counter() - start) * 1e3)
    report = {key: statistics.median(v) for key, v in times.items()}
    report.update(
        threads=args.threads,
        rounds=args.rounds,
        load_average=list(os.getloadavg()),
        versions={"torch": torch.__version__, "transformers": transformers.__version__},
        shapes=shapes,
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
