"""The client half of scripts/bench-real-scale.sh: real HTTP requests to a running `switchyard
serve`, timed as a user meets them. Prints one JSON line.

    python3 client.py --base http://127.0.0.1:PORT --model phi4mm-real --pid SERVER_PID \
        --wav clip_30s.wav --png image_1344x896.png
"""

import argparse
import base64
import http.client
import json
import threading
import time
import urllib.parse
import uuid


def post(base, path, body, headers, stream=False):
    u = urllib.parse.urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    c.request("POST", path, body=body, headers=headers)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {r.read()[:500]!r}")
    return c, r


def chat_stream(base, model, messages, max_tokens, model_options=None):
    """Streams one greedy chat completion; returns the arrival time of every content chunk."""
    req = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
           "stream": True}
    if model_options:
        req["model_options"] = model_options
    t0 = time.perf_counter()
    c, r = post(base, "/v1/chat/completions", json.dumps(req), {"content-type": "application/json"})
    times = []
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise RuntimeError(ev["error"])
        for ch in ev.get("choices", []):
            # Every token's chunk, even one whose text is empty: random weights over the
            # fixture's small tokenizer mostly pick ids that have no text.
            delta = ch.get("delta", {})
            if "content" in delta and "role" not in delta:
                times.append(time.perf_counter() - t0)
    c.close()
    return times


def rss(pid):
    st = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            st[k] = int(v.split()[0]) * 1024
    return st


def decode_rate(streams):
    """Tokens per second while every stream was decoding (after the last first token, before the
    first stream ended)."""
    start = max(s[0] for s in streams)
    end = min(s[-1] for s in streams)
    n = sum(sum(1 for t in s if start < t <= end) for s in streams)
    return n / (end - start) if end > start else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--wav", required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("--decode-tokens", type=int, default=32)
    a = ap.parse_args()
    out = {}
    # The text prompt as ids (the chat template of the real model: <|user|> … <|end|><|assistant|>),
    # so its length is exact whatever the tokenizer.
    user, end, assistant = 200021, 200020, 200019

    def ids(n):
        # Ids the checkpoint's (the fixture's) tokenizer defines: the plugin refuses the others,
        # and the work per position is the same for any id.
        body = [(i * 7919 + 13) % 1000 for i in range(n - 3)]
        return [user] + body + [end, assistant]

    msgs = [{"role": "user", "content": []}]
    # Warm-up request (first touch of the mapped weights), not reported.
    chat_stream(a.base, a.model, msgs, 2, {"input_ids": ids(16)})

    s = chat_stream(a.base, a.model, msgs, a.decode_tokens, {"input_ids": ids(16)})
    out["decode_batch1_tokens_per_s"] = (len(s) - 1) / (s[-1] - s[0])

    streams = [None] * 8
    def one(i):
        streams[i] = chat_stream(a.base, a.model, msgs, a.decode_tokens, {"input_ids": ids(16 + i)})
    th = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    out["decode_batch8_tokens_per_s"] = decode_rate(streams)

    s = chat_stream(a.base, a.model, msgs, 4, {"input_ids": ids(1000)})
    out["ttft_1000_token_prompt_s"] = s[0]

    png = base64.b64encode(open(a.png, "rb").read()).decode()
    s = chat_stream(a.base, a.model, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "text", "text": "Describe the image."}]}], 8)
    out["image_1344x896_request"] = {"ttft_s": s[0], "total_s": s[-1], "tokens": len(s)}

    wav = base64.b64encode(open(a.wav, "rb").read()).decode()
    s = chat_stream(a.base, a.model, [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
        {"type": "text", "text": "Summarise the audio."}]}], 8)
    out["audio_30s_request"] = {"ttft_s": s[0], "total_s": s[-1], "tokens": len(s)}

    boundary = uuid.uuid4().hex
    parts = []
    for name, val in (("model", a.model), ("response_format", "json")):
        parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{val}\r\n".encode())
    parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"clip.wav\"\r\n"
                 "Content-Type: audio/wav\r\n\r\n".encode() + open(a.wav, "rb").read() + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    t = time.perf_counter()
    c, r = post(a.base, "/v1/audio/transcriptions", b"".join(parts),
                {"content-type": f"multipart/form-data; boundary={boundary}"})
    text = json.loads(r.read())["text"]
    c.close()
    out["transcription_30s_s"] = time.perf_counter() - t
    out["transcription_chars"] = len(text)
    out["server_memory_bytes"] = rss(a.pid)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
