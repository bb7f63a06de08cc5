"""Merges rust_gemm.json and torch_gemm.json (same GPU run) into report_gemm.md: TFLOP/s of
both and ours as a fraction of torch.matmul's (cuBLAS).

usage: report_gemm.py DIR
"""
import json
import sys


def main():
    d = sys.argv[1]
    ours = {(s["dtype"], s["m"], s["n"], s["k"]): s["us"] for s in json.load(open(f"{d}/rust_gemm.json"))}
    torch = {(s["dtype"], s["m"], s["n"], s["k"]): s["us"] for s in json.load(open(f"{d}/torch_gemm.json"))}
    lines = ["| dtype | M x N x K | ours TFLOP/s | torch.matmul TFLOP/s | ours / torch |", "|---|---|---|---|---|"]
    for key, us in ours.items():
        dt, m, n, k = key
        fl = 2 * m * n * k
        t = torch.get(key)
        ratio = f"{t / us:.2f}" if t else "-"
        tt = f"{fl / t / 1e6:.1f}" if t else "-"
        lines.append(f"| {dt} | {m}x{n}x{k} | {fl / us / 1e6:.1f} | {tt} | {ratio} |")
    text = "\n".join(lines) + "\n"
    open(f"{d}/report_gemm.md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
