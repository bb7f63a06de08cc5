"""Merges rust_dense_matvec.json and torch_dense_matvec.json (one directory) into
report_dense_matvec.csv: per dtype, shape and batch, our time, GB/s and % of the same run's
copy bandwidth, PyTorch's (cuBLAS) time and % of copy, and PyTorch time / ours.

usage: report_dense_matvec.py DIR
"""
import csv
import json
import os
import sys


def main():
    d = sys.argv[1]
    ours = json.load(open(os.path.join(d, "rust_dense_matvec.json")))
    peer = {}
    tp = os.path.join(d, "torch_dense_matvec.json")
    if os.path.exists(tp):
        for s in json.load(open(tp))["samples"]:
            peer[(s["dtype"], s["rows"], s["cols"], s["batch"])] = s
    rows = []
    for s in ours:
        key = (s["dtype"], s["rows"], s["cols"], s["batch"])
        t = peer.get(key)
        copy = s["copy_gbps"]
        torch_gbps = t["moved"] / t["us"] / 1e3 if t else None
        rows.append(dict(
            dtype=s["dtype"], rows=s["rows"], cols=s["cols"], batch=s["batch"],
            us=f'{s["us"]:.2f}', gbps=f'{s["gbps"]:.0f}', pct_of_copy=f'{s["pct_of_copy"]:.1f}',
            torch_us=f'{t["us"]:.2f}' if t else "", torch_pct_of_copy=f"{100 * torch_gbps / copy:.1f}" if t else "",
            torch_over_ours=f'{t["us"] / s["us"]:.2f}' if t else "",
        ))
    out = os.path.join(d, "report_dense_matvec.csv")
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(",".join(str(v) for v in r.values()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
