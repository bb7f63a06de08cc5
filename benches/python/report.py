"""Merges rust_elementwise.json and torch_elementwise.json (one GPU run) into a Markdown
table (report.md), a CSV (report.csv) and, when matplotlib is available, a PNG plot of
bandwidth against size (bandwidth.png).

usage: report.py DIR
"""
import sys

from reportlib import load_json


def main():
    d = sys.argv[1]
    rust = load_json(d, "rust_elementwise.json")
    torch = load_json(d, "torch_elementwise.json")
    t_index = {(s["op"], s["dtype"], s["bytes"]): s for s in torch["samples"]}
    r_copy = {s["bytes"]: s["gbps"] for s in rust["samples"] if s["op"] == "copy"}
    rows = []
    for s in rust["samples"]:
        t = t_index.get((s["op"], s["dtype"], s["bytes"]))
        rows.append(dict(
            op=s["op"], dtype=s["dtype"], bytes=s["bytes"], rust_us=s["us"], rust_gbps=s["gbps"],
            pct_copy=100 * s["gbps"] / r_copy[s["bytes"]],
            torch_us=t["us"] if t else float("nan"),
            speedup=(t["us"] / s["us"]) if t else float("nan"),
        ))
    with open(f"{d}/report.csv", "w") as f:
        f.write("op,dtype,bytes,rust_us,rust_gbps,pct_of_copy,torch_us,torch_over_rust\n")
        for r in rows:
            f.write(f"{r['op']},{r['dtype']},{r['bytes']},{r['rust_us']:.3f},{r['rust_gbps']:.1f},{r['pct_copy']:.1f},{r['torch_us']:.3f},{r['speedup']:.3f}\n")
    lines = [
        f"Device: {rust['device']} (PyTorch {torch['torch']}). Bandwidth = bytes read + written / time (GPU events, median).",
        f"Launch overhead: empty kernel {rust['launch_us']:.2f} us per launch vs PyTorch 1-element fill {torch['launch_us']:.2f} us.",
        "",
        "| op | dtype | buffer | ours GB/s | % of copy | ours us | PyTorch us | PyTorch time / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    def size(b):
        return f"{b >> 30} GiB" if b >= 1 << 30 else f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    for r in rows:
        if r["bytes"] in (4096, 1 << 20, 64 << 20, 256 << 20, 1 << 30):
            lines.append(f"| {r['op']} | {r['dtype']} | {size(r['bytes'])} | {r['rust_gbps']:.0f} | {r['pct_copy']:.0f}% | {r['rust_us']:.2f} | {r['torch_us']:.2f} | {r['speedup']:.2f} |")
    open(f"{d}/report.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot")
        return
    fig, ax = plt.subplots(figsize=(9, 5.5))
    keys = sorted({(r["op"], r["dtype"]) for r in rows})
    for op, dt in keys:
        pts = [(r["bytes"], r["rust_gbps"]) for r in rows if (r["op"], r["dtype"]) == (op, dt)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=f"ours {op} {dt}")
    for op, dt in keys:
        if op == "copy":
            pts = [(s["bytes"], s["gbps"]) for s in torch["samples"] if s["op"] == op]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--", label="PyTorch copy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer bytes")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_title(f"Elementwise bandwidth on {rust['device']}")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{d}/bandwidth.png", dpi=110)
    print(f"wrote {d}/bandwidth.png")


if __name__ == "__main__":
    main()
