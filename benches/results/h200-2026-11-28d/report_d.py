"""Builds report_d.csv from this folder's call outputs: one row per serve-load run (calls A,
B, C, G: model, server configuration, offered rate, requests, completed, achieved req/s,
output tokens/s, TTFT and ITL percentiles, ITL p99/p50, and for saturation runs the ratio
to the mean offline engine throughput of the same call and model), and one row per
`llm-worker bench` run of calls D-F (tensor parallelism: configuration, TP, concurrency,
decode tokens/s); and, where matplotlib is installed, report_d.svg: ITL p99/p50 against
the offered rate per server configuration (calls A, B, C, G; the 2x target drawn)."""
import csv, glob, json, os, re

here = os.path.dirname(os.path.abspath(__file__))
rows = []

def offline_mean(path, conc=48):
    vals = [json.loads(l)["output_tok_s"] for l in open(path) if l.startswith("{") and json.loads(l)["concurrency"] == conc]
    return sum(vals) / len(vals) if vals else None

for call, model, off in [("A", "1b-bf16", "offline.log"), ("B", "1b-bf16", "offline.log"), ("C", "1b-bf16", "offline.log"), ("G", "8b-bf16", "offline8b.log")]:
    d = os.path.join(here, f"call{call}")
    base = offline_mean(os.path.join(d, off))
    for f in sorted(glob.glob(os.path.join(d, "load_*.jsonl"))):
        cfg = os.path.basename(f)[len("load_"):-len(".jsonl")]
        for l in open(f):
            j = json.loads(l)
            sat = j["rate_req_s"] == "inf"
            rows.append({
                "call": call, "kind": "serve", "model": model, "config": cfg, "rate_req_s": j["rate_req_s"], "requests": j["requests"], "ok": j["ok"],
                "req_s": round(j["req_s"], 2), "output_tok_s": round(j["output_tok_s"], 1),
                "ttft_ms_p50": round(j["ttft_ms_p50"], 2), "ttft_ms_p99": round(j["ttft_ms_p99"], 2),
                "itl_ms_p50": round(j["itl_ms_p50"], 3), "itl_ms_p99": round(j["itl_ms_p99"], 3), "itl_p99_over_p50": round(j["itl_ms_p99"] / j["itl_ms_p50"], 2),
                "offline_output_tok_s": round(base, 1) if sat and base else "", "vs_offline": round(j["output_tok_s"] / base, 3) if sat and base else "",
                "tensor_parallel": "", "concurrency": "", "decode_tok_s": "",
            })

for call in "DEF":
    for f in sorted(glob.glob(os.path.join(here, f"call{call}", "bench_*.log"))):
        cfg = os.path.basename(f)[len("bench_"):-len(".log")]
        for l in open(f):
            if not l.startswith("{"):
                continue
            j = json.loads(l)
            rows.append({"call": call, "kind": "tp-bench", "model": "8b-bf16", "config": cfg, "tensor_parallel": j["tensor_parallel"], "concurrency": j["concurrency"], "decode_tok_s": round(j["decode_tok_s"], 1), "ttft_ms_p50": round(j["ttft_ms"], 2)})

fields = ["call", "kind", "model", "config", "rate_req_s", "requests", "ok", "req_s", "output_tok_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "itl_p99_over_p50", "offline_output_tok_s", "vs_offline", "tensor_parallel", "concurrency", "decode_tok_s"]
with open(os.path.join(here, "report_d.csv"), "w", newline="") as out:
    w = csv.DictWriter(out, fieldnames=fields, restval="")
    w.writeheader()
    w.writerows(rows)
print(f"{len(rows)} rows")


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot")
        return
    names = {"cap128w4": "cap 128, backlog 4 (default)", "cap256w4": "cap 256, backlog 4", "uncapped": "no cap", "cap128w2": "cap 128, backlog 2",
             "cap128w1": "cap 128, backlog 1", "cap128w4_nomixed": "cap 128, backlog 4, mixed steps eager", "cap128": "cap 128, no backlog", "default8b": "cap 128, backlog 4 (default)", "uncapped8b": "no cap"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, model, calls in [(axes[0], "1b-bf16", "ABC"), (axes[1], "8b-bf16", "G")]:
        serve = [r for r in rows if r["kind"] == "serve" and r["model"] == model and r["call"] in calls and r["rate_req_s"] != "inf"]
        for cfg in sorted({r["config"].removesuffix("_b") for r in serve}):
            g = sorted((float(r["rate_req_s"]), float(r["itl_p99_over_p50"])) for r in serve if r["config"].removesuffix("_b") == cfg)
            ax.plot([x[0] for x in g], [x[1] for x in g], "o", label=names.get(cfg, cfg))
        ax.axhline(2.0, color="grey", ls=":", label="target (2x)")
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_ylabel("inter-token latency p99 / p50")
        ax.set_title(f"{model}, prompt 512, 256 tokens, one H200")
        ax.set_ylim(bottom=1.0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


plot(rows, os.path.join(here, "report_d.svg"))
