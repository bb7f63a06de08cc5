"""Merges rust_llm.json and torch_llm.json (one GPU run) into report_llm.md / report_llm.csv:
per op, dtype and shape, our time and bandwidth, the share of the device-to-device copy
bandwidth measured in the same run, and PyTorch's time over ours (> 1: we are faster).

usage: report_llm.py DIR
"""
import sys

from reportlib import load_json


def main():
    d = sys.argv[1]
    rust = load_json(d, "rust_llm.json")
    torch = load_json(d, "torch_llm.json")
    t_index = {(s["op"], s["dtype"], s["shape"]): s for s in torch["samples"]}
    copy = next(s["gbps"] for s in rust["samples"] if s["op"] == "copy")
    rows = []
    for s in rust["samples"]:
        if s["op"] == "copy":
            continue
        t = t_index.get((s["op"], s["dtype"], s["shape"]))
        rows.append(dict(op=s["op"], dtype=s["dtype"], shape=s["shape"], us=s["us"], gbps=s["gbps"],
                         pct=100 * s["gbps"] / copy, torch_us=t["us"] if t else float("nan"),
                         ratio=(t["us"] / s["us"]) if t else float("nan")))
    with open(f"{d}/report_llm.csv", "w") as f:
        f.write("op,dtype,shape,rust_us,rust_gbps,pct_of_copy,torch_us,torch_over_rust\n")
        for r in rows:
            f.write(f"{r['op']},{r['dtype']},{r['shape']},{r['us']:.3f},{r['gbps']:.1f},{r['pct']:.1f},{r['torch_us']:.3f},{r['ratio']:.3f}\n")
    lines = [
        f"Device: {rust['device']} (PyTorch {torch['torch']}). Copy bandwidth (256 MiB, same run): {copy:.0f} GB/s.",
        "Bandwidth = bytes an ideal kernel reads and writes once / time (GPU events, median).",
        "",
        "| op | dtype | shape | ours us | ours GB/s | % of copy | PyTorch us | PyTorch time / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['us']:.2f} | {r['gbps']:.0f} | {r['pct']:.0f}% | {r['torch_us']:.2f} | {r['ratio']:.2f} |")
    open(f"{d}/report_llm.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
