"""Drives POST /v1/completions with the real `openai` client, unmodified, and prints one JSON
line with what it got: a plain completion (with logprobs), and the same request streamed with
stream_options.include_usage.

Usage: completions.py BASE_URL MODEL PROMPT_JSON MAX_TOKENS LOGPROBS
(PROMPT_JSON is a JSON string or array of token ids; LOGPROBS an integer, or -1 for none.)
"""

import json
import sys

import openai


def main():
    base_url, model, prompt, max_tokens, logprobs = sys.argv[1:6]
    prompt = json.loads(prompt)
    logprobs = None if int(logprobs) < 0 else int(logprobs)
    client = openai.OpenAI(api_key="unused", base_url=base_url + "/v1", max_retries=0)
    common = dict(model=model, prompt=prompt, max_tokens=int(max_tokens), temperature=0)
    plain = client.completions.create(logprobs=logprobs, **common)
    choice = plain.choices[0]
    out = {
        "object": plain.object,
        "text": choice.text,
        "finish_reason": choice.finish_reason,
        "usage": plain.usage.model_dump(),
        "logprobs": choice.logprobs.model_dump() if choice.logprobs else None,
    }
    streamed, finish, usage, chunks = "", None, None, 0
    for chunk in client.completions.create(
        stream=True, stream_options={"include_usage": True}, **common
    ):
        chunks += 1
        for c in chunk.choices:
            streamed += c.text
            finish = c.finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    out.update(streamed=streamed, stream_finish=finish, stream_usage=usage, chunks=chunks)
    # A refused request: the client raises the API's error with its status and message.
    try:
        client.completions.create(model=model, prompt=[prompt, prompt])
        out["batch"] = "accepted"
    except openai.BadRequestError as e:
        out["batch"] = {"status": e.status_code, "message": str(e)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
