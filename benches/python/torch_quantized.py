"""PyTorch peers of the Rust `quantized` bench, timed with CUDA events on the same GPU.

PyTorch has no GGUF matvec, so this times a different workload of the same logical shape:
the bf16 matrix-vector product `F.linear(x, W)` with `W` of `rows x cols` in bf16 (2 bytes
per weight, against 0.56 for Q4_0). Both are memory-bound, so the comparison that matters
is each one's share of the copy bandwidth. Writes torch_quantized.json.

usage: torch_quantized.py [--out DIR] [--quick]
"""
import json

import torch
import torch.nn.functional as F

from torch_elementwise import peer_args, timed


def main():
    args = peer_args()
    dev = torch.device("cuda")
    shapes = [(4096, 14336)] if args.quick else [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]
    samples = []
    for rows, cols in shapes:
        w = torch.randn(rows, cols, dtype=torch.bfloat16, device=dev)
        for batch in (1, 2, 4, 8):
            if batch > 1 and (rows, cols) not in ((4096, 14336), (14336, 4096)):
                continue
            x = torch.randn(batch, cols, dtype=torch.bfloat16, device=dev)
            nb = rows * cols * 2
            us = timed(lambda: F.linear(x, w), nb)
            moved = nb + batch * (cols + rows) * 2
            samples.append(dict(op="bf16_linear", rows=rows, cols=cols, batch=batch, moved=moved, us=us))
            print(f"bf16 linear {rows}x{cols} b{batch}: {us:8.2f} us {moved / us / 1e3:8.1f} GB/s")
        del w
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, samples=samples),
              open(f"{args.out}/torch_quantized.json", "w"), indent=1)


if __name__ == "__main__":
    main()
