"""Merges rust_gemm.json and torch_gemm.json (same GPU run) into report_gemm.md: TFLOP/s of
both and ours as a fraction of torch.matmul's (cuBLAS), for `gemm_tiled` (op `matmul`,
mma.sync on NVIDIA) and, where it ran, `gemm_wgmma` (op `matmul_wgmma`, sm_90a); with
cutlass_gemm.jsonl (same run, benches/cuda/cutlass_sm80_gemm.cu) also the best CUTLASS Sm80
(mma.sync) kernel per bf16 shape.

usage: report_gemm.py DIR
"""
import json
import os
import sys

from reportlib import load_json


def main():
    d = sys.argv[1]
    rows = load_json(d, "rust_gemm.json")
    ours = {(s["dtype"], s["m"], s["n"], s["k"]): s["us"] for s in rows if s.get("op", "matmul") == "matmul"}
    wg = {(s["dtype"], s["m"], s["n"], s["k"]): s["us"] for s in rows if s.get("op") == "matmul_wgmma"}
    torch = {(s["dtype"], s["m"], s["n"], s["k"]): s["us"] for s in load_json(d, "torch_gemm.json")}
    # Best CUTLASS Sm80 configuration per shape (bf16 only), and which one it was.
    cutlass = {}
    if os.path.exists(f"{d}/cutlass_gemm.jsonl"):
        for line in open(f"{d}/cutlass_gemm.jsonl"):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            key = ("bf16", r["m"], r["n"], r["k"])
            if "us" in r and (key not in cutlass or r["us"] < cutlass[key][0]):
                cutlass[key] = (r["us"], r["config"])
    lines = ["| dtype | M x N x K | ours (tiled) TFLOP/s | torch.matmul TFLOP/s | tiled / torch | CUTLASS Sm80 TFLOP/s (config) | tiled / CUTLASS | ours (wgmma) TFLOP/s | wgmma / torch |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, us in ours.items():
        dt, m, n, k = key
        fl = 2 * m * n * k
        t = torch.get(key)
        ratio = f"{t / us:.2f}" if t else "-"
        tt = f"{fl / t / 1e6:.1f}" if t else "-"
        c = cutlass.get(key)
        ct = f"{fl / c[0] / 1e6:.1f} ({c[1]})" if c else "-"
        cr = f"{c[0] / us:.2f}" if c else "-"
        w = wg.get(key)
        wt = f"{fl / w / 1e6:.1f}" if w else "-"
        wr = f"{t / w:.2f}" if (w and t) else "-"
        lines.append(f"| {dt} | {m}x{n}x{k} | {fl / us / 1e6:.1f} | {tt} | {ratio} | {ct} | {cr} | {wt} | {wr} |")
    text = "\n".join(lines) + "\n"
    open(f"{d}/report_gemm.md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
