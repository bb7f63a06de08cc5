"""torch.matmul (cuBLAS) on the shapes of the Rust `gemm` bench, timed with CUDA events on
the same GPU. Writes torch_gemm.json.

usage: torch_gemm.py [--out DIR] [--quick]
"""
import json

import torch

from torch_elementwise import peer_args, timed


def main():
    args = peer_args()
    dev = torch.device("cuda")
    squares = [1024, 4096] if args.quick else [1024, 2048, 4096, 8192]
    tokens = [1, 4096] if args.quick else [1, 16, 64, 256, 1024, 4096]
    weights = [(4096, 4096), (4096, 14336), (14336, 4096)]
    shapes = [(s, s, s) for s in squares] + [(m, n, k) for (k, n) in weights for m in tokens]
    samples = []
    for name, dt in [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)]:
        todo = shapes if name != "f32" else [(4096, 4096, 4096)]
        for m, n, k in todo:
            a = torch.rand(m, k, dtype=dt, device=dev) * 2 - 1
            b = torch.rand(k, n, dtype=dt, device=dev) * 2 - 1
            us = timed(lambda: torch.matmul(a, b), 2 * m * n * k)
            samples.append(dict(op="matmul", dtype=name, m=m, n=n, k=k, us=us))
            print(f"torch {name:<5} {m:>5} x {n:>5} x {k:>5} {us:10.1f} us {2 * m * n * k / us / 1e6:7.1f} TFLOP/s")
    print("allow_tf32:", torch.backends.cuda.matmul.allow_tf32)
    with open(f"{args.out}/torch_gemm.json", "w") as f:
        json.dump(samples, f, indent=1)


if __name__ == "__main__":
    main()
