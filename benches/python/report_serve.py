"""Builds report_serve.csv (and report_serve.svg when matplotlib is there) from the serve part
of `nvidia.sh report` (issue 31): `llm-worker serve` under the load generator, rate by rate,
against the engine offline on the same shapes.

usage: report_serve.py DIR

Inputs in DIR (each optional; <tag> is 1b_bf16, 8b_bf16, 8b_q4k, or one of those followed by
_chunk<N> for a server run with --prefill-chunk-while-decoding N, _chunk<N>w<W> with
--prefill-cap-backlog W as well):
- load_<tag>.jsonl: serve-load, one line per rate (output tok/s, TTFT and inter-token latency
  percentiles as the client sees them);
- metrics_<tag>_start.txt, metrics_<tag>_rate_<r>.txt: /metrics before the first rate and
  after each; the difference of two snapshots is what that rate's requests cost on the
  engine thread (engine steps, runner forward + logits download by step kind);
- offline_<model>.jsonl: `llm-worker bench` at the saturation concurrency (all requests at
  once, the same prompt and output lengths, no HTTP);
- ../../benches/results/vllm_published.csv or DIR/vllm_published.csv: published vLLM
  figures, printed beside ours with their sources (different workloads are said so there).

Columns of report_serve.csv:
- model, config (default, chunk<N> or chunk<N>w<W>), rate_req_s, requests, ok, output_tok_s, req_s,
  ttft_ms_p50/p99, itl_ms_p50/p99, itl_p99_over_p50;
- step_ms_mean: mean engine step over this rate (from the metrics deltas), mean_sampled:
  tokens sampled per step (the mean decode batch), decode_runner_ms: mean runner time of a
  pure-decode step, host_ms_per_step: engine step minus runner time (scheduling, host
  sampling, token events), between_steps_ms: engine-thread time between steps per step;
- offline_output_tok_s, server_over_offline (rate inf only): our server's output tok/s over
  the engine's offline output tok/s at the same concurrency; the issue's target is >= 0.95;
- half_saturation (yes on the highest rate <= half the saturated req/s): the issue wants
  itl_p99_over_p50 <= 2 there.
"""
import csv
import glob
import json
import os
import re
import sys


def metrics(path):
    """Prometheus text -> {series: value} (histogram buckets dropped)."""
    out = {}
    if not os.path.isfile(path):
        return out
    for line in open(path):
        if line.startswith("#") or "_bucket{" in line:
            continue
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def delta(a, b, k):
    return b.get(k, 0.0) - a.get(k, 0.0)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    rows = []
    for path in sorted(glob.glob(os.path.join(d, "load_*.jsonl"))):
        tag = os.path.basename(path)[len("load_"):-len(".jsonl")]
        mt = re.match(r"(.*?)(?:_(chunk\d+(?:w\d+)?))?$", tag)
        model, chunk = mt.group(1), mt.group(2)
        lines = [json.loads(l) for l in open(path) if l.strip()]
        # In the order the rates ran (each metrics snapshot follows its rate).
        prev = metrics(os.path.join(d, f"metrics_{tag}_start.txt"))
        offline = {}
        opath = os.path.join(d, f"offline_{model}.jsonl")
        if os.path.isfile(opath):
            for l in open(opath):
                if l.strip():
                    j = json.loads(l)
                    offline[j["concurrency"]] = j
        for j in lines:
            r = str(j["rate_req_s"])
            r = r if r == "inf" else format_rate(r)
            cur = metrics(os.path.join(d, f"metrics_{tag}_rate_{r}.txt"))
            row = dict(model=model.replace("_", "-"), config=chunk or "default", rate_req_s=r,
                       requests=j["requests"], ok=j["ok"], output_tok_s=j["output_tok_s"], req_s=j["req_s"],
                       ttft_ms_p50=j["ttft_ms_p50"], ttft_ms_p99=j["ttft_ms_p99"],
                       itl_ms_p50=j["itl_ms_p50"], itl_ms_p99=j["itl_ms_p99"],
                       itl_p99_over_p50=j["itl_ms_p99"] / j["itl_ms_p50"] if j["itl_ms_p50"] else None,
                       errors="; ".join(j.get("errors", []))[:200])
            steps = delta(prev, cur, "llm_engine_step_seconds_count")
            if cur and steps > 0:
                row["step_ms_mean"] = delta(prev, cur, "llm_engine_step_seconds_sum") / steps * 1e3
                row["mean_sampled"] = delta(prev, cur, "llm_engine_generated_tokens_total") / steps
                runner = delta(prev, cur, "llm_runner_decode_seconds_total") + delta(prev, cur, "llm_runner_mixed_seconds_total")
                row["host_ms_per_step"] = (delta(prev, cur, "llm_engine_step_seconds_sum") - runner) / steps * 1e3
                row["between_steps_ms"] = delta(prev, cur, "llm_engine_between_steps_seconds_total") / steps * 1e3
                ds = delta(prev, cur, "llm_runner_decode_steps_total")
                if ds > 0:
                    row["decode_runner_ms"] = delta(prev, cur, "llm_runner_decode_seconds_total") / ds * 1e3
                    row["decode_rows"] = delta(prev, cur, "llm_runner_decode_tokens_total") / ds
                ms = delta(prev, cur, "llm_runner_mixed_steps_total")
                if ms > 0:
                    row["mixed_runner_ms"] = delta(prev, cur, "llm_runner_mixed_seconds_total") / ms * 1e3
                    row["mixed_tokens"] = delta(prev, cur, "llm_runner_mixed_tokens_total") / ms
            if cur:
                prev = cur
            if r == "inf" and j["requests"] in offline:
                o = offline[j["requests"]]
                row["offline_output_tok_s"] = o["output_tok_s"]
                row["offline_decode_tok_s"] = o["decode_tok_s"]
                row["server_over_offline"] = j["output_tok_s"] / o["output_tok_s"]
            rows.append(row)
    # Half of saturation: per model and config, the highest rate <= req_s(inf) / 2.
    for key in {(r["model"], r["config"]) for r in rows}:
        group = [r for r in rows if (r["model"], r["config"]) == key]
        sat = [r for r in group if r["rate_req_s"] == "inf"]
        if sat:
            half = sat[0]["req_s"] / 2
            under = [r for r in group if r["rate_req_s"] != "inf" and float(r["rate_req_s"]) <= half]
            if under:
                max(under, key=lambda r: float(r["rate_req_s"]))["half_saturation"] = "yes"
    cols = ["model", "config", "rate_req_s", "requests", "ok", "output_tok_s", "req_s", "ttft_ms_p50", "ttft_ms_p99",
            "itl_ms_p50", "itl_ms_p99", "itl_p99_over_p50", "half_saturation", "step_ms_mean", "mean_sampled",
            "decode_runner_ms", "decode_rows", "mixed_runner_ms", "mixed_tokens", "host_ms_per_step", "between_steps_ms",
            "offline_output_tok_s", "offline_decode_tok_s", "server_over_offline", "errors"]
    out = os.path.join(d, "report_serve.csv")
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items() if k in cols})
    print(f"wrote {out} ({len(rows)} rows)")
    fmt = lambda v, p=1: "-" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))
    print("model    config   rate  out_tok/s  ttft_p50  itl_p50  itl_p99  p99/p50  step_ms  batch  dec_runner_ms  host_ms  server/offline")
    for r in rows:
        print(f"{r['model']:8} {r['config']:8} {r['rate_req_s']:>5} {fmt(r['output_tok_s']):>9} {fmt(r['ttft_ms_p50']):>9} "
              f"{fmt(r['itl_ms_p50'], 2):>8} {fmt(r['itl_ms_p99'], 2):>8} {fmt(r['itl_p99_over_p50'], 2):>8} "
              f"{fmt(r.get('step_ms_mean'), 2):>8} {fmt(r.get('mean_sampled')):>6} {fmt(r.get('decode_runner_ms'), 2):>14} "
              f"{fmt(r.get('host_ms_per_step'), 2):>8} {fmt(r.get('server_over_offline'), 3):>14}"
              + ("  <- half saturation" if r.get("half_saturation") else ""))
    for cand in [os.path.join(d, "vllm_published.csv"), os.path.join(os.path.dirname(__file__), "vllm_published.csv"),
                 os.path.join(os.path.dirname(__file__), "..", "results", "vllm_published.csv")]:
        if os.path.isfile(cand):
            print(f"\npublished vLLM figures ({cand}; not our workload unless the row says so):")
            for p in csv.DictReader(open(cand)):
                print(f"  {p['model']} on {p['gpu']}: {p['metric']} = {p['value']} ({p['workload']}) [{p['source']}]")
            break
    plot(rows, os.path.join(d, "report_serve.svg"))


def format_rate(r):
    """The rate as nvidia.sh wrote it in a file name (2, not 2.0)."""
    x = float(r)
    return str(int(x)) if x == int(x) else str(x)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key in sorted({(r["model"], r["config"]) for r in rows}):
        g = [r for r in rows if (r["model"], r["config"]) == key]
        x = [r["output_tok_s"] for r in g]
        label = f"{key[0]} {key[1]}"
        a.plot(x, [r["itl_ms_p50"] for r in g], "o-", label=f"{label} p50")
        a.plot(x, [r["itl_ms_p99"] for r in g], "x--", label=f"{label} p99")
        b.plot(x, [r["ttft_ms_p50"] for r in g], "o-", label=f"{label} p50")
        off = [r["offline_output_tok_s"] for r in g if r.get("offline_output_tok_s")]
        if off:
            a.axvline(off[0], color="grey", ls=":", label=f"{key[0]} offline engine")
    a.set_xlabel("output tokens/s (server, rates light to inf)")
    a.set_ylabel("inter-token latency (ms)")
    b.set_xlabel("output tokens/s")
    b.set_ylabel("time to first token (ms)")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
