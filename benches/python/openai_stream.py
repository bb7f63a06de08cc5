"""Streams a chat completion from a running `llm-worker serve` with the official `openai`
client (issue 31) and times it as a client sees it.

usage: openai_stream.py [--base-url URL] [--api-key KEY] [--max-tokens N] [--out DIR]
                        [--tie-nats X]

Three greedy requests of one prompt, with the sampled token's logprob and the top 2:
  A  streamed (`stream_options` include_usage), on a cold prefix cache: its prefill runs
     every prompt token (a GEMM of all prompt rows);
  B  whole, after A: the prefix cache serves the prompt's full blocks, so its prefill runs
     only the last few prompt tokens (the small-row matvec path), a different numeric path
     for those tokens' KV and the first logits;
  C  streamed again, after B: the same cache hits and kernels as B.
Checks:
  - C's tokens and text equal B's exactly: streamed and whole answers of one request on the
    same numeric path must match (this is the check of the SSE path: a token lost, repeated,
    reordered or taken from another request fails it);
  - A equals B, or where they first differ both runs saw a near-tie: the token each chose is
    among the other run's top-5 within --tie-nats of that run's most likely token (bf16 logits
    of a random-weight model are close to ties; a different kernel for 4 KV rows moves them
    by a few hundredths). A divergence at a clear margin is an error;
  - more than one content chunk, usage of streamed and whole answers agree, a finish reason.
Prints one JSON line (and writes DIR/openai_stream.json): time to the first content chunk,
chunks, completion tokens, tokens/s after the first chunk, finish reason, the A/B divergence
(index, gaps) if any. Exits non-zero on any failed check.
"""
import argparse
import json
import os
import sys
import time

from openai import OpenAI


def streamed(c, kw):
    """(text, token entries, usage, finish, chunks, t_first, t_last, t0) of a streamed answer."""
    t0 = time.perf_counter()
    first, last, chunks, text, usage, finish, toks = None, None, 0, "", None, None, []
    for chunk in c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        now = time.perf_counter()
        if chunk.choices:
            ch = chunk.choices[0]
            if ch.logprobs and ch.logprobs.content:
                toks += ch.logprobs.content
            if ch.delta.content:
                chunks += 1
                text += ch.delta.content
                first = first if first is not None else now
                last = now
            finish = ch.finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    return text, toks, usage, finish, chunks, first, last, t0


def topk(entry):
    """The most likely (token, logprob) of a token entry (top_logprobs of them), most likely first."""
    return sorted(((x.token, x.logprob) for x in entry.top_logprobs), key=lambda x: -x[1])


def within(t, token, nats):
    """Whether `token` is among the candidates `t` within `nats` of the most likely one."""
    return any(tok == token and t[0][1] - lp < nats for tok, lp in t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    p.add_argument("--api-key", default="none")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--tie-nats", type=float, default=0.1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    c = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    model = c.models.list().data[0].id
    msgs = [{"role": "user", "content": "Write a short story about a GPU."}]
    kw = dict(model=model, messages=msgs, max_tokens=args.max_tokens, temperature=0, logprobs=True, top_logprobs=5)

    text_a, toks_a, usage, finish, chunks, first, last, t0 = streamed(c, kw)
    total = time.perf_counter() - t0
    whole = c.chat.completions.create(**kw)
    text_b = whole.choices[0].message.content
    toks_b = whole.choices[0].logprobs.content if whole.choices[0].logprobs else []
    text_c, toks_c, usage_c, _, _, _, _, _ = streamed(c, kw)

    errors = []
    ids = lambda toks: [t.token for t in toks]
    if not text_a:
        errors.append("no content streamed")
    if chunks < 2:
        errors.append(f"{chunks} content chunk(s): not streamed")
    if usage is None or usage_c is None:
        errors.append("no usage chunk despite include_usage")
    elif not (usage.completion_tokens == usage_c.completion_tokens == whole.usage.completion_tokens == len(toks_b)):
        errors.append(f"usage differs: streamed {usage.completion_tokens} and {usage_c.completion_tokens}, whole {whole.usage.completion_tokens}, {len(toks_b)} logprob entries")
    if finish is None:
        errors.append("no finish_reason")
    # Same numeric path: streamed and whole must agree exactly.
    if text_c != text_b or ids(toks_c) != ids(toks_b):
        errors.append(f"streamed (warm cache) differs from whole (warm cache): {text_c!r} vs {text_b!r}")
    # Cold vs warm prefix cache: equal, or a near-tie where they part.
    divergence = None
    if ids(toks_a) != ids(toks_b):
        i = next((k for k, (x, y) in enumerate(zip(ids(toks_a), ids(toks_b))) if x != y), min(len(toks_a), len(toks_b)))
        if i >= min(len(toks_a), len(toks_b)):
            errors.append(f"cold and warm answers differ in length only ({len(toks_a)} vs {len(toks_b)} tokens)")
        else:
            ta, tb = topk(toks_a[i]), topk(toks_b[i])
            gap_a = ta[0][1] - ta[1][1] if len(ta) >= 2 else float("inf")
            gap_b = tb[0][1] - tb[1][1] if len(tb) >= 2 else float("inf")
            # A near-tie: each run's choice is among the other run's candidates within
            # --tie-nats of its top (two or more tokens that close together; bf16 noise picks one).
            tie = within(ta, tb[0][0], args.tie_nats) and within(tb, ta[0][0], args.tie_nats)
            divergence = dict(token_index=i, a=ta, b=tb, gap_a_nats=gap_a, gap_b_nats=gap_b, near_tie=tie)
            if not tie:
                errors.append(f"cold-cache and warm-cache answers part at token {i} without a near-tie: {divergence}")
    if text_a != text_b and divergence is None and ids(toks_a) == ids(toks_b):
        errors.append(f"same tokens but different text: {text_a!r} vs {text_b!r}")
    tokens = usage.completion_tokens if usage else None
    j = dict(model=model, max_tokens=args.max_tokens, ttft_ms=(first - t0) * 1e3 if first else None,
             total_ms=total * 1e3, content_chunks=chunks, completion_tokens=tokens,
             prompt_tokens=usage.prompt_tokens if usage else None, finish_reason=finish,
             decode_tok_s=(tokens - 1) / (last - first) if tokens and tokens > 1 and last > first else None,
             text_chars=len(text_a), stream_equals_whole=text_c == text_b,
             cold_equals_warm=text_a == text_b, cold_warm_divergence=divergence, errors=errors)
    print(json.dumps(j))
    if args.out:
        with open(os.path.join(args.out, "openai_stream.json"), "w") as f:
            json.dump(j, f, indent=1)
    if errors:
        sys.exit("; ".join(errors))
    note = "" if divergence is None else f"; cold/warm prefix cache part at token {divergence['token_index']} at a near-tie (gaps {divergence['gap_a_nats']:.3g}, {divergence['gap_b_nats']:.3g} nats)"
    print(f"ok: {chunks} chunks streamed, streamed text equals the whole completion on the same path, usage {tokens} tokens{note}")


if __name__ == "__main__":
    main()
