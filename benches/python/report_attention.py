"""Merges rust_attention.json and torch_attention.json (same GPU run) into
report_attention.csv, one row per shape and peer (issue 29's columns):

kind (prefill|decode), dtype, causal, batch, heads, kv_heads, seq (decode: context),
head_dim, block_size (decode), ours, unit (TFLOP/s|GB/s), peer (sdpa-flash|sdpa-cudnn|
sdpa-gathered), peer_value, ratio (ours / peer), pct_of_copy (decode: ours over the 1 GiB
device-to-device copy bandwidth the Rust bench measured in the same run, in %), and
ours_fragments (prefill where the launcher took the Hopper `wgmma` kernel: the fragment
kernel's TFLOP/s on the same shape in the same run).

Decode's peer value is SDPA over the already gathered cache (torch_attention.py's `us`);
the gather-inclusive figure stays in torch_attention.json (`gbps_with_gather`).

usage: report_attention.py DIR
"""
import csv
import sys

from reportlib import load_json, write_csv

COLUMNS = ["kind", "dtype", "causal", "batch", "heads", "kv_heads", "seq", "head_dim", "block_size", "ours", "unit",
           "peer", "peer_value", "ratio", "pct_of_copy", "ours_fragments"]


def key(r):
    return (r["kind"], r["dtype"], bool(r["causal"]), r["batch"], r["heads"], r["kv_heads"], r["seq"], r["head_dim"])


def main():
    d = sys.argv[1]
    ours = load_json(d, "rust_attention.json")
    peers = load_json(d, "torch_attention.json")["samples"]
    by_key = {}
    for p in peers:
        by_key.setdefault(key(p), []).append(p)
    rows = []
    for o in ours:
        prefill = o["kind"] == "prefill"
        value = o["tflops"] if prefill else o["gbps"]
        base = dict(kind=o["kind"], dtype=o["dtype"], causal=str(bool(o["causal"])).lower(), batch=o["batch"], heads=o["heads"],
                    kv_heads=o["kv_heads"], seq=o["seq"], head_dim=o["head_dim"], block_size="" if prefill else o["block_size"],
                    ours=f"{value:.2f}", unit="TFLOP/s" if prefill else "GB/s",
                    pct_of_copy="" if prefill else f"{100 * o['gbps'] / o['copy_gbps']:.1f}",
                    ours_fragments=f"{o['tflops_fragments']:.2f}" if o.get("tflops_fragments") else "")
        matched = by_key.get(key(o), [])
        if not matched:
            rows.append(dict(base, peer="", peer_value="", ratio=""))
        for p in matched:
            if "skipped" in p:
                rows.append(dict(base, peer=p["peer"], peer_value="", ratio=""))
                continue
            pv = p["tflops"] if prefill else p["gbps"]
            rows.append(dict(base, peer=p["peer"], peer_value=f"{pv:.2f}", ratio=f"{value / pv:.3f}"))
    write_csv(f"{d}/report_attention.csv", COLUMNS, rows)
    w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)


if __name__ == "__main__":
    main()
