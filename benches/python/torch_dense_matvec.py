"""PyTorch peer of the Rust `dense_matvec` bench: `F.linear(x, W)` (cuBLAS) with `W` of
`rows x cols` in bf16 (and f16 on the 8B shapes), timed with CUDA events on the same GPU,
cycling through copies of the weights (256 MiB in all) so that every call reads them from
DRAM as the Rust bench does. Writes torch_dense_matvec.json.

usage: torch_dense_matvec.py [--out DIR] [--quick]
"""
import argparse
import json

import torch
import torch.nn.functional as F

from torch_elementwise import timed

SHAPES = [(2048, 2048), (2048, 8192), (8192, 2048), (4096, 4096), (4096, 14336), (14336, 4096), (128256, 4096)]
COLD_BYTES = 256 << 20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    dev = torch.device("cuda")
    samples = []
    for name, dtype, shapes in (("bf16", torch.bfloat16, SHAPES), ("f16", torch.float16, SHAPES[3:6])):
        for rows, cols in ([(4096, 14336)] if args.quick else shapes):
            nb = rows * cols * 2
            copies = max(1, min(64, -(-COLD_BYTES // nb)))
            ws = [torch.randn(rows, cols, dtype=dtype, device=dev) for _ in range(copies)]
            for batch in (1, 2, 4, 8):
                if batch > 1 and (rows, cols) not in ((4096, 14336), (14336, 4096)):
                    continue
                x = torch.randn(batch, cols, dtype=dtype, device=dev)
                turn = [0]

                def call():
                    turn[0] += 1
                    return F.linear(x, ws[turn[0] % copies])

                us = timed(call, nb)
                moved = nb + batch * (cols + rows) * 2
                samples.append(dict(dtype=name, rows=rows, cols=cols, batch=batch, moved=moved, us=us, copies=copies))
                print(f"{name} linear {rows}x{cols} b{batch}: {us:8.2f} us {moved / us / 1e3:8.1f} GB/s")
            del ws
            torch.cuda.empty_cache()
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, samples=samples),
              open(f"{args.out}/torch_dense_matvec.json", "w"), indent=1)


if __name__ == "__main__":
    main()
