"""Builds report_engine.csv (issue 30) from the engine part of `nvidia.sh report`: our
`llm-worker bench` lines and the peers' lines, all in one directory.

usage: report_engine.py DIR

Inputs (each optional; a model or backend without a file has no row):
- ours_<model>.jsonl: `llm-worker bench` (one line per concurrency), backend `ours`;
- torch_<model>.jsonl: torch_engine.py (backends `torch`, `torch-compile`; lines with an
  `error` become rows without figures and the error in `note`);
- candle_<model>.jsonl: `candle-peer` (`llama_e2e` for bf16 shapes, `qllama` for GGUF),
  batch 1, backend `candle-cuda`; TTFT is its prefill time (prompt to first token);
- llamacpp_<model>.jsonl: lines {"concurrency", "decode_tok_s", "ttft_ms"}, backend
  `llama.cpp` (benches/llamacpp/run.sh, built and run on the GPU machine);
- copy.json (torch_engine.py copy): the same run's copy bandwidth.
<model> is 1b_bf16, 8b_bf16 or 8b_q4k (written 1b-bf16 ... in the CSV).

Columns:
- decode_tok_s: aggregate decode tokens/s (all sequences), median over a backend's timed runs
  (Candle's first timed run left out when there are several, as report_e2e.py does);
- ttft_ms: mean time to first token (prefill of the whole batch), median over runs;
- pct_of_bandwidth_limit (concurrency 1 only): bytes a decode step must read (every weight
  matrix once, the LM head, norms, one embedding row, and the KV cache at the mean context
  prompt + gen/2) times decode tok/s, over the copy bandwidth: 100 means the step runs at
  copy speed;
- ratio_vs_ours: the peer's time per token over ours (our decode tok/s over the backend's)
  at the same model and concurrency; above 1 we are faster (docs/benchmarks.md's convention);
- note: errors, and what a row is not.
"""
import glob
import json
import os
import re
import statistics
import sys

from reportlib import load_jsonl, print_markdown, write_csv

# The shapes `llm-worker write-random --shape` writes (workers/llm/src/random.rs, Shape::B1 and
# Shape::B8) and `gguf-llama --shape 8b`; the 1B ties the LM head to the embedding.
SHAPES = {
    "1b": dict(vocab=128256, hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8, head_dim=64),
    "8b": dict(vocab=128256, hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8, head_dim=128),
}
# Bytes per weight of a matrix, and of a norm vector (GGUF keeps norms in f32).
FORMATS = {"bf16": (2.0, 2.0), "q4k": (144 / 256, 4.0)}
# Bytes per weight of the output head where it differs: Q4_K files (gguf-llama, as Q4_K_M
# files) keep the head in Q6_K.
HEAD_BYTES = {"q4k": 210 / 256}
KV_BYTES = 2  # bf16 / f16 cache entries on every backend

BACKENDS = ["ours", "candle-cuda", "torch", "torch-compile", "llama.cpp"]
COLUMNS = ["model", "concurrency", "backend", "decode_tok_s", "ttft_ms", "pct_of_bandwidth_limit", "ratio_vs_ours", "note"]


def step_bytes(model, prompt_len, gen):
    """Bytes an ideal batch-1 decode step reads for `model` (e.g. "8b-q4k")."""
    size, fmt = model.split("-")
    s, (wb, nb) = SHAPES[size], FORMATS[fmt]
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    per_layer = (h * q + 2 * h * kv + q * h + 3 * h * s["inter"]) * wb + 2 * h * nb
    weights = s["layers"] * per_layer + s["vocab"] * h * HEAD_BYTES.get(fmt, wb) + h * nb + h * wb
    context = prompt_len + gen / 2
    kv_cache = s["layers"] * 2 * kv * KV_BYTES * context
    return weights + kv_cache


def copy_gbps(d):
    p = os.path.join(d, "copy.json")
    if os.path.exists(p):
        return json.load(open(p))["copy_gbps"], "copy.json"
    # The matvec part's log of the same report call, when it ran.
    for log in glob.glob(os.path.join(d, "..", "bench-dense-matvec.log")):
        m = re.search(r"copy 1 GiB: [\d.]+ us, ([\d.]+) GB/s", open(log).read())
        if m:
            return float(m.group(1)), "bench-dense-matvec.log"
    return None, None


def median(xs):
    return statistics.median(xs) if xs else None


def collect(d):
    """{(model, concurrency, backend): dict(decode, ttft, note, prompt_len, gen)}."""
    out = {}
    for path in sorted(glob.glob(os.path.join(d, "*_*.jsonl"))):
        name = os.path.basename(path)[:-len(".jsonl")]
        kind, _, tag = name.partition("_")
        model = tag.replace("_", "-")
        if model.split("-")[0] not in SHAPES or model.split("-")[-1] not in FORMATS:
            continue
        rows = load_jsonl(path)
        if kind == "ours":
            for r in rows:
                out[(model, r["concurrency"], "ours")] = dict(
                    decode=r["decode_tok_s"], ttft=r["ttft_ms"], prompt_len=r["prompt_len"], gen=r["gen"], note="")
        elif kind == "torch":
            groups = {}
            for r in rows:
                groups.setdefault((r["backend"], r["concurrency"]), []).append(r)
            for (backend, c), rs in groups.items():
                ok = [r for r in rs if "error" not in r]
                errs = [r["error"] for r in rs if "error" in r]
                if ok:
                    out[(model, c, backend)] = dict(
                        decode=median([r["decode_tok_s"] for r in ok]), ttft=median([r["ttft_ms"] for r in ok]),
                        prompt_len=ok[0]["prompt_len"], gen=ok[0]["gen"],
                        note=f"median of {len(ok)} runs" + (f"; also failed: {errs[0]}" if errs else ""))
                else:
                    out[(model, c, backend)] = dict(decode=None, ttft=None, prompt_len=rs[0]["prompt_len"],
                                                    gen=rs[0]["gen"], note="failed: " + errs[0])
        elif kind == "candle":
            use = rows[1:] if len(rows) > 1 else rows
            if use:
                out[(model, 1, "candle-cuda")] = dict(
                    decode=median([r["decode_tok_s"] for r in use]), ttft=median([r["prefill_s"] * 1e3 for r in use]),
                    prompt_len=use[0]["prompt"], gen=use[0]["steps"],
                    note=f"median of {len(use)} runs; " + ("same GGUF file" if model.endswith("q4k") else
                                                             "candle-transformers llama, random weights drawn by Candle"))
        elif kind == "llamacpp":
            for r in rows:
                out[(model, r["concurrency"], "llama.cpp")] = dict(
                    decode=r["decode_tok_s"], ttft=r.get("ttft_ms"), prompt_len=r.get("prompt_len"), gen=r.get("gen"), note="")
    return out


def fmt(x, digits):
    return "" if x is None else f"{x:.{digits}f}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    data = collect(d)
    if not data:
        sys.exit(f"no engine results in {d}")
    copy, copy_src = copy_gbps(d)
    rows = []
    order = {b: i for i, b in enumerate(BACKENDS)}
    for (model, c, backend) in sorted(data, key=lambda k: (k[0], k[1], order.get(k[2], 99))):
        r = data[(model, c, backend)]
        ours = data.get((model, c, "ours"))
        pct = None
        if c == 1 and r["decode"] and copy and r["prompt_len"] and r["gen"]:
            pct = 100 * step_bytes(model, r["prompt_len"], r["gen"]) * r["decode"] / (copy * 1e9)
        ratio = ours["decode"] / r["decode"] if ours and ours["decode"] and r["decode"] else None
        note = r["note"]
        if ours and r["prompt_len"] and (r["prompt_len"], r["gen"]) != (ours["prompt_len"], ours["gen"]):
            note = (note + "; " if note else "") + f"prompt {r['prompt_len']}, {r['gen']} tokens (ours {ours['prompt_len']}, {ours['gen']})"
        rows.append(dict(model=model, concurrency=c, backend=backend, decode_tok_s=fmt(r["decode"], 1),
                         ttft_ms=fmt(r["ttft"], 1), pct_of_bandwidth_limit=fmt(pct, 1), ratio_vs_ours=fmt(ratio, 2), note=note))
    out = os.path.join(d, "report_engine.csv")
    write_csv(out, COLUMNS, rows)
    print(f"copy bandwidth: {copy_src or 'none (pct_of_bandwidth_limit left empty)'}" + (f", {copy:.0f} GB/s" if copy else ""))
    print_markdown(COLUMNS, rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
