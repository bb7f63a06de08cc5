"""Merges rust_dense_matvec.json and torch_dense_matvec.json (one directory) into
report_dense_matvec.csv: per dtype, shape and batch, our time, GB/s and % of the same run's
copy bandwidth, PyTorch's (cuBLAS) time and % of copy (of our run's copy, and of the copy
the PyTorch script timed itself), and PyTorch time / ours; prints it and a table per shape
of % of copy for every batch, ours / PyTorch's. PyTorch's samples come from its JSON or,
where that file is missing, from the `TORCH {...}` lines of ../torch-dense-matvec.log.

usage: report_dense_matvec.py DIR
"""
import json
import os
import sys

from reportlib import load_json, write_csv


def main():
    d = sys.argv[1]
    ours = load_json(d, "rust_dense_matvec.json")
    peer = {}
    tp = os.path.join(d, "torch_dense_matvec.json")
    log = os.path.join(d, "..", "torch-dense-matvec.log")
    samples = []
    if os.path.exists(tp):
        samples = json.load(open(tp))["samples"]
    elif os.path.exists(log):
        samples = [json.loads(line[len("TORCH "):]) for line in open(log) if line.startswith("TORCH ")]
    for s in samples:
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
            torch_pct_of_own_copy=f'{t["pct_of_copy"]:.1f}' if t and "pct_of_copy" in t else "",
            torch_over_ours=f'{t["us"] / s["us"]:.2f}' if t else "",
        ))
    out = os.path.join(d, "report_dense_matvec.csv")
    write_csv(out, list(rows[0].keys()), rows)
    for r in rows:
        print(",".join(str(v) for v in r.values()))
    print(f"wrote {out}")
    shapes = []
    for r in rows:
        if (r["dtype"], r["rows"], r["cols"]) not in shapes:
            shapes.append((r["dtype"], r["rows"], r["cols"]))
    batches = sorted({r["batch"] for r in rows})
    print("\n% of copy per batch, ours / PyTorch (cuBLAS); weights cold")
    print("dtype        shape " + "".join(f"{'M=' + str(b):>13}" for b in batches))
    for key in shapes:
        cells = []
        for b in batches:
            r = next((r for r in rows if (r["dtype"], r["rows"], r["cols"]) == key and r["batch"] == b), None)
            cells.append(f'{r["pct_of_copy"] + "/" + (r["torch_pct_of_copy"] or "-"):>13}' if r else f'{"":>13}')
        print(f"{key[0]:>5} {str(key[1]) + 'x' + str(key[2]):>12} " + "".join(cells))


if __name__ == "__main__":
    main()
