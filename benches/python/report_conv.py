"""Merges rust_conv.json and torch_conv.json (same GPU run) into report_conv.md: TFLOP/s of
the implicit-GEMM conv (`conv_implicit`), the im2col + GEMM path it replaces
(`conv_im2col`), 1x1 layers as one GEMM (`conv_1x1_gemm`) and cuDNN through PyTorch (NCHW
and channels-last), the channels-last implicit GEMM (`conv_nhwc`; on Hopper the wgmma
kernel, with the GEMM pipeline's kernel as `conv_nhwc_tiled`), with implicit / im2col,
implicit / best cuDNN, conv_nhwc against cuDNN channels-last and the best cuDNN, and
candle-rocm's route through it for NCHW tensors (`conv_nhwc_route`: transposes included)
against im2col + cuBLAS (`torch_im2col_cublas`).

usage: report_conv.py DIR
"""
import sys

from reportlib import load_json


def main():
    d = sys.argv[1]
    rows = load_json(d, "rust_conv.json")
    torch_rows = load_json(d, "torch_conv.json", missing=[])
    by = {}
    flops = {}
    order = []
    for r in rows + torch_rows:
        key = (r["dtype"], r["layer"])
        if key not in by:
            by[key] = {}
            order.append(key)
        by[key][r["op"]] = r["us"]
        oh = (r["h"] + 2 * r["padding"] - r["k"]) // r["stride"] + 1
        ow = (r["w"] + 2 * r["padding"] - r["k"]) // r["stride"] + 1
        flops[key] = 2 * r["batch"] * r["c_out"] * oh * ow * r["c_in"] * r["k"] ** 2
    ops = ["conv_implicit", "conv_im2col", "conv_1x1_gemm", "conv_nhwc", "conv_nhwc_tiled", "conv_nhwc_n128", "conv_nhwc_n160", "conv_nhwc_n128_nosplit", "conv_nhwc_n160_nosplit", "conv_nhwc_s3", "conv_nhwc_s4", "conv_nhwc_s6", "conv_nhwc_nosplit", "conv_nhwc_route", "torch_nchw", "torch_channels_last", "torch_im2col_cublas"]
    lines = ["| dtype | layer | " + " | ".join(f"{o} TFLOP/s" for o in ops)
             + " | implicit / im2col | implicit / best cuDNN | nhwc / cuDNN channels-last | nhwc / best cuDNN | nhwc_route / im2col+cuBLAS |",
             "|---|---|" + "---|" * (len(ops) + 5)]
    total = {o: 0.0 for o in ops}
    for key in order:
        us = by[key]
        fl = flops[key]
        cells = [f"{fl / us[o] / 1e6:.1f}" if o in us else "-" for o in ops]
        for o in ops:
            total[o] += us.get(o, 0.0)
        imp = us.get("conv_implicit")
        r1 = f"{us['conv_im2col'] / imp:.2f}" if imp and "conv_im2col" in us else "-"
        cud = [us[o] for o in ("torch_nchw", "torch_channels_last") if o in us]
        r2 = f"{min(cud) / imp:.2f}" if imp and cud else "-"
        nh = us.get("conv_nhwc")
        r3 = f"{us['torch_channels_last'] / nh:.2f}" if nh and "torch_channels_last" in us else "-"
        r4 = f"{min(cud) / nh:.2f}" if nh and cud else "-"
        rt = us.get("conv_nhwc_route")
        r5 = f"{us['torch_im2col_cublas'] / rt:.2f}" if rt and "torch_im2col_cublas" in us else "-"
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + f" | {r1} | {r2} | {r3} | {r4} | {r5} |")
    lines.append("")
    lines.append("Sum of per-layer times (us): " + ", ".join(f"{o} {total[o]:.0f}" for o in ops if total[o] > 0))
    text = "\n".join(lines) + "\n"
    open(f"{d}/report_conv.md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
