"""Smoke test of a running server with the official `openai` Python client (pip install openai).

    python workers/llm-server/examples/openai_client.py [BASE_URL] [API_KEY]

Lists the model, warms the prefix cache with the prompt, asks a greedy chat completion whole
(with logprobs) and streamed (with usage), checks that both texts are equal, runs a seeded completion with logprobs, and checks that an
unknown model is a 404 and n=2 a 400. Exits non-zero on any mismatch.
"""
import sys

import openai
from openai import OpenAI

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
key = sys.argv[2] if len(sys.argv) > 2 else "none"
c = OpenAI(base_url=base, api_key=key, max_retries=0)
model = c.models.list().data[0].id
msgs = [{"role": "user", "content": "Hello!"}]
# One request first so that both compared answers find the prompt's full blocks in the prefix
# cache: a cold prefill runs the prompt through other kernels (one GEMM over all its rows)
# than a warm one (the few rows past the cached blocks), and bf16 near-ties of a
# random-weight model can then part later in the answer (benches/python/openai_stream.py).
c.chat.completions.create(model=model, messages=msgs, max_tokens=1, temperature=0)
whole = c.chat.completions.create(model=model, messages=msgs, max_tokens=32, temperature=0,
                                  logprobs=True, top_logprobs=2)
text = whole.choices[0].message.content
print(f"model {model}: {text!r} ({whole.choices[0].finish_reason}, {whole.usage})")
streamed, usage = "", None
for chunk in c.chat.completions.create(model=model, messages=msgs, max_tokens=32, temperature=0,
                                       stream=True, stream_options={"include_usage": True}):
    if chunk.choices:
        streamed += chunk.choices[0].delta.content or ""
    elif chunk.usage:
        usage = chunk.usage
assert streamed == text, (streamed, text)
assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens, usage
t = c.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0.7,
                         seed=3, logprobs=2)
assert len(t.choices[0].logprobs.tokens) <= 8
for bad, status in [(dict(model="no-such-model"), 404), (dict(model=model, n=2), 400)]:
    try:
        c.completions.create(prompt="x", **bad)
        raise SystemExit(f"{bad} was accepted")
    except openai.APIStatusError as e:
        assert e.status_code == status, (bad, e.status_code)
print("ok: whole == streamed, usage, logprobs, 404, 400")
