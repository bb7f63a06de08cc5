"""PyTorch peer of the Rust `dense_matvec` bench: `F.linear(x, W)` (cuBLAS) with `W` of
`rows x cols` in bf16 (and f16 on the 8B shapes but the head), every batch 1..8, timed with
CUDA events on the same GPU, cycling through copies of the weights (256 MiB in all) so that
every call reads them from DRAM as the Rust bench does. Also times a 1 GiB device copy
(bytes read + written, as the Rust bench) so each sample carries its % of copy. Writes
torch_dense_matvec.json and prints every sample as a JSON line (`TORCH {...}`) and a table
of % of copy to stdout, so the numbers reach the report log even where the JSON file does
not come back.

usage: torch_dense_matvec.py [--out DIR] [--quick]
"""
import json

import torch
import torch.nn.functional as F

from torch_elementwise import peer_args, timed

SHAPES = [(2048, 2048), (2048, 8192), (8192, 2048), (512, 2048), (4096, 4096), (4096, 14336), (14336, 4096),
          (1024, 4096), (128256, 4096)]
F16_SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (1024, 4096)]
BATCHES = (1, 2, 3, 4, 5, 6, 7, 8)
COLD_BYTES = 256 << 20


def main():
    args = peer_args()
    dev = torch.device("cuda")
    gib = 1 << 30
    src = torch.empty(gib, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_us = timed(lambda: dst.copy_(src), gib)
    copy_gbps = 2 * gib / copy_us / 1e3
    print(f"copy 1 GiB: {copy_us:.1f} us, {copy_gbps:.0f} GB/s", flush=True)
    del src, dst
    torch.cuda.empty_cache()
    samples = []
    table = []
    for name, dtype, shapes in (("bf16", torch.bfloat16, SHAPES), ("f16", torch.float16, F16_SHAPES)):
        for rows, cols in ([(4096, 14336)] if args.quick else shapes):
            nb = rows * cols * 2
            copies = max(1, min(64, -(-COLD_BYTES // nb)))
            ws = [torch.randn(rows, cols, dtype=dtype, device=dev) for _ in range(copies)]
            pcts = []
            for batch in ((1, 8) if args.quick else BATCHES):
                x = torch.randn(batch, cols, dtype=dtype, device=dev)
                turn = [0]

                def call():
                    turn[0] += 1
                    return F.linear(x, ws[turn[0] % copies])

                us = timed(call, nb)
                moved = nb + batch * (cols + rows) * 2
                gbps = moved / us / 1e3
                s = dict(dtype=name, rows=rows, cols=cols, batch=batch, moved=moved, us=us, gbps=gbps,
                         pct_of_copy=100 * gbps / copy_gbps, copy_gbps=copy_gbps, copies=copies)
                samples.append(s)
                pcts.append(s["pct_of_copy"])
                print("TORCH " + json.dumps(s), flush=True)
            table.append((name, rows, cols, pcts))
            del ws
            torch.cuda.empty_cache()
    print(f"\nPyTorch F.linear, % of copy ({copy_gbps:.0f} GB/s), weights cold:")
    print("dtype        shape " + "".join(f"{'M=' + str(b):>6}" for b in BATCHES))
    for name, rows, cols, pcts in table:
        print(f"{name:>5} {f'{rows}x{cols}':>12} " + "".join(f"{p:6.1f}" for p in pcts))
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, copy_gbps=copy_gbps, samples=samples),
              open(f"{args.out}/torch_dense_matvec.json", "w"), indent=1)


if __name__ == "__main__":
    main()
