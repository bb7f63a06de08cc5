"""torch.nn.functional.conv2d (cuDNN, benchmark mode) on the layer shapes of the Rust `conv`
bench (SD 1.5 UNet and VAE decoder: sd_conv_layers.csv, the table both read), NCHW and
channels-last, timed with CUDA events on the same GPU, and im2col + cuBLAS (`F.unfold`
then one batched matmul). Writes torch_conv.json (ops `torch_nchw`,
`torch_channels_last`, `torch_im2col_cublas`).

usage: torch_conv.py [--out DIR] [--quick] [--dtype f16|bf16]
"""
import csv
import json
import os

import torch
import torch.nn.functional as F

from torch_elementwise import peer_args, timed


def load_layers():
    """The layer table the Rust `conv` bench times too (sd_conv_layers.csv beside this
    script): (layer, batch, c_in, h, w, c_out, kernel, stride, padding) tuples."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sd_conv_layers.csv"), newline="") as f:
        rows = list(csv.reader(f))[1:]
    return [(r[0], *(int(x) for x in r[1:])) for r in rows if r]


LAYERS = load_layers()


def main():
    args = peer_args(("--dtype", dict(default="f16")))
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    layers = [l for l in LAYERS if l[0].startswith("unet 320")] if args.quick else LAYERS
    samples = []
    for layer, b, c_in, h, w, c_out, k, stride, padding in layers:
        x = torch.rand(b, c_in, h, w, dtype=dt, device=dev) * 2 - 1
        wt = torch.rand(c_out, c_in, k, k, dtype=dt, device=dev) * 2 - 1
        oh = (h + 2 * padding - k) // stride + 1
        ow = (w + 2 * padding - k) // stride + 1
        flops = 2 * b * c_out * oh * ow * c_in * k * k
        for op, fmt in [("torch_nchw", torch.contiguous_format), ("torch_channels_last", torch.channels_last)]:
            xf, wf = x.contiguous(memory_format=fmt), wt.contiguous(memory_format=fmt)
            us = timed(lambda: F.conv2d(xf, wf, stride=stride, padding=padding), flops)
            samples.append(dict(op=op, layer=layer, dtype=args.dtype, batch=b, c_in=c_in, h=h, w=w, c_out=c_out, k=k, stride=stride, padding=padding, us=us))
            print(f"{op:<20} {args.dtype:<5} {layer:<26} {us:10.1f} us {flops / us / 1e6:7.1f} TFLOP/s")
        # im2col + cuBLAS (the path candle-rocm took for NVIDIA conv2d before the
        # channels-last kernel): unfold, then one batched matmul.
        w2 = wt.reshape(c_out, -1)
        us = timed(lambda: torch.matmul(w2, F.unfold(x, k, padding=padding, stride=stride)), flops)
        op = "torch_im2col_cublas"
        samples.append(dict(op=op, layer=layer, dtype=args.dtype, batch=b, c_in=c_in, h=h, w=w, c_out=c_out, k=k, stride=stride, padding=padding, us=us))
        print(f"{op:<20} {args.dtype:<5} {layer:<26} {us:10.1f} us {flops / us / 1e6:7.1f} TFLOP/s")
    print("cudnn:", torch.backends.cudnn.version())
    with open(f"{args.out}/torch_conv.json", "w") as f:
        json.dump(samples, f, indent=1)


if __name__ == "__main__":
    main()
