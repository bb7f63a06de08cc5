"""torch.nn.functional.conv2d (cuDNN, benchmark mode) on the layer shapes of the Rust `conv`
bench (SD 1.5 UNet and VAE decoder), NCHW and channels-last, timed with CUDA events on the
same GPU. Writes torch_conv.json (ops `torch_nchw`, `torch_channels_last`).

usage: torch_conv.py [--out DIR] [--quick] [--dtype f16|bf16]
"""
import argparse
import json

import torch
import torch.nn.functional as F

from torch_elementwise import timed

# (layer, batch, c_in, h, w, c_out, kernel, stride, padding): benches/src/bin/conv.rs LAYERS.
LAYERS = [
    ("unet conv_in", 2, 4, 64, 64, 320, 3, 1, 1),
    ("unet 320 3x3 @64", 2, 320, 64, 64, 320, 3, 1, 1),
    ("unet 320 down s2", 2, 320, 64, 64, 320, 3, 2, 1),
    ("unet 320->640 3x3 @32", 2, 320, 32, 32, 640, 3, 1, 1),
    ("unet 640 3x3 @32", 2, 640, 32, 32, 640, 3, 1, 1),
    ("unet 320->640 1x1 @32", 2, 320, 32, 32, 640, 1, 1, 0),
    ("unet 640 down s2", 2, 640, 32, 32, 640, 3, 2, 1),
    ("unet 640->1280 3x3 @16", 2, 640, 16, 16, 1280, 3, 1, 1),
    ("unet 1280 3x3 @16", 2, 1280, 16, 16, 1280, 3, 1, 1),
    ("unet 1280 down s2", 2, 1280, 16, 16, 1280, 3, 2, 1),
    ("unet 1280 3x3 @8", 2, 1280, 8, 8, 1280, 3, 1, 1),
    ("unet 2560->1280 3x3 @8", 2, 2560, 8, 8, 1280, 3, 1, 1),
    ("unet 2560->1280 3x3 @16", 2, 2560, 16, 16, 1280, 3, 1, 1),
    ("unet 1920->1280 3x3 @16", 2, 1920, 16, 16, 1280, 3, 1, 1),
    ("unet 1920->640 3x3 @32", 2, 1920, 32, 32, 640, 3, 1, 1),
    ("unet 1280->640 3x3 @32", 2, 1280, 32, 32, 640, 3, 1, 1),
    ("unet 960->640 3x3 @32", 2, 960, 32, 32, 640, 3, 1, 1),
    ("unet 960->320 3x3 @64", 2, 960, 64, 64, 320, 3, 1, 1),
    ("unet 640->320 3x3 @64", 2, 640, 64, 64, 320, 3, 1, 1),
    ("unet 2560->1280 1x1 @16", 2, 2560, 16, 16, 1280, 1, 1, 0),
    ("unet 320 1x1 @64 (proj)", 2, 320, 64, 64, 320, 1, 1, 0),
    ("unet conv_out", 2, 320, 64, 64, 4, 3, 1, 1),
    ("vae 512 3x3 @64", 1, 512, 64, 64, 512, 3, 1, 1),
    ("vae 512 3x3 @128", 1, 512, 128, 128, 512, 3, 1, 1),
    ("vae 512->256 3x3 @256", 1, 512, 256, 256, 256, 3, 1, 1),
    ("vae 256 3x3 @256", 1, 256, 256, 256, 256, 3, 1, 1),
    ("vae 128 3x3 @512", 1, 128, 512, 512, 128, 3, 1, 1),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dtype", default="f16")
    args = p.parse_args()
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
    print("cudnn:", torch.backends.cudnn.version())
    with open(f"{args.out}/torch_conv.json", "w") as f:
        json.dump(samples, f, indent=1)


if __name__ == "__main__":
    main()
