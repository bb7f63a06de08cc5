"""Streams a chat completion from a running `llm-worker serve` with the official `openai`
client (issue 31) and times it as a client sees it.

usage: openai_stream.py [--base-url URL] [--api-key KEY] [--max-tokens N] [--out DIR]

Lists the served model, asks a greedy chat completion streamed (`stream_options`
include_usage) and the same one whole, and checks that the streamed text equals the whole
one, that content arrived in more than one chunk, and that the usage of both agrees with
the number of streamed content chunks' tokens. Prints one JSON line (and writes
DIR/openai_stream.json): time to the first content chunk, chunks, completion tokens,
tokens/s after the first chunk, finish reason. Exits non-zero on any mismatch.
"""
import argparse
import json
import os
import sys
import time

from openai import OpenAI


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    p.add_argument("--api-key", default="none")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    c = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    model = c.models.list().data[0].id
    msgs = [{"role": "user", "content": "Write a short story about a GPU."}]
    kw = dict(model=model, messages=msgs, max_tokens=args.max_tokens, temperature=0)

    t0 = time.perf_counter()
    first, last, chunks, text, usage, finish = None, None, 0, "", None, None
    for chunk in c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        now = time.perf_counter()
        if chunk.choices:
            ch = chunk.choices[0]
            if ch.delta.content:
                chunks += 1
                text += ch.delta.content
                first = first if first is not None else now
                last = now
            finish = ch.finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    total = time.perf_counter() - t0
    whole = c.chat.completions.create(**kw)

    errors = []
    if not text:
        errors.append("no content streamed")
    if chunks < 2:
        errors.append(f"{chunks} content chunk(s): not streamed")
    if text != whole.choices[0].message.content:
        errors.append(f"streamed text differs from the whole one: {text!r} vs {whole.choices[0].message.content!r}")
    if usage is None:
        errors.append("no usage chunk despite include_usage")
    elif usage.completion_tokens != whole.usage.completion_tokens:
        errors.append(f"usage differs: streamed {usage.completion_tokens}, whole {whole.usage.completion_tokens}")
    if finish is None:
        errors.append("no finish_reason")
    tokens = usage.completion_tokens if usage else None
    j = dict(model=model, max_tokens=args.max_tokens, ttft_ms=(first - t0) * 1e3 if first else None,
             total_ms=total * 1e3, content_chunks=chunks, completion_tokens=tokens,
             prompt_tokens=usage.prompt_tokens if usage else None, finish_reason=finish,
             decode_tok_s=(tokens - 1) / (last - first) if tokens and tokens > 1 and last > first else None,
             text_chars=len(text), errors=errors)
    print(json.dumps(j))
    if args.out:
        with open(os.path.join(args.out, "openai_stream.json"), "w") as f:
            json.dump(j, f, indent=1)
    if errors:
        sys.exit("; ".join(errors))
    print(f"ok: {chunks} chunks streamed, text equals the whole completion, usage {tokens} tokens")


if __name__ == "__main__":
    main()
