"""Merges rust_quantized.json with torch_quantized.json (and candle_quantized.json, Candle's
CUDA quantized matvec, when present: a list of {dtype, rows, cols, batch, us}) into
report_quantized.md: per format and shape, our time, our share of the copy bandwidth of the
same run, the bf16 PyTorch matvec of the same logical shape (a different workload), and
Candle's time over ours when measured. Candle's `QMatMul::forward` quantizes the activations
to q8_1 and then runs its matvec (two kernels), so the like-for-like ratio is Candle's time
over ours with the quantization (`+quantize`); the ratio over our matvec alone is shown
beside it. Both sides cycle through copies of the weights (256 MiB in all), so each call
reads them from DRAM as a decode step does; `hot us` times one copy in a loop (part of a
matrix under 50 MB then comes from the L2 cache). `+quantize` calls alternate between two
copies of the activations, so every call quantizes its own; `chained` calls all take the same
activations (one input's projections: q, k, v; gate, up), which `ops::matvec` quantizes once
and whose matvecs each start while the one before ends. `read ceiling` (when
read_ceiling.txt is present): the fastest a kernel that only reads the same bytes went,
launched back to back, in the same session.

usage: report_quantized.py DIR
"""
import os
import sys

from reportlib import load_json


def main():
    d = sys.argv[1]
    rust = load_json(d, "rust_quantized.json")
    torch = load_json(d, "torch_quantized.json", missing={"samples": []})
    candle = load_json(d, "candle_quantized.json", missing=[])
    t_index = {(s["rows"], s["cols"], s["batch"]): s for s in torch["samples"]}
    c_index = {(s["dtype"], s["rows"], s["cols"], s["batch"]): s for s in candle}
    copy = rust[0]["copy_gbps"]
    lines = [
        f"Copy bandwidth (1 GiB device-to-device, same run): {copy:.0f} GB/s. Bandwidth = (quantized weights + q8_1",
        "activations + f32 output) / time (GPU events, median of 5), the calls cycling through copies of the weights",
        "(256 MiB in all: read from DRAM, as in a decode step). `hot us`: one copy in a loop (partly from L2).",
        "`+quantize`: the whole op with the activations'",
        "q8_1 quantization (a second kernel), new activations every call. `chained`: `ops::matvec` on the same",
        "activations every call (quantized once; each matvec overlaps the end of the one before), as % of copy.",
        "PyTorch: bf16 `F.linear` of the same logical shape (4x-3.5x more bytes).",
        "",
        "`Candle / ours`: Candle's `QMatMul::forward` (q8_1 quantization + matvec) over ours with the quantization",
        "(`+quantize`, the same work); in brackets over our matvec alone. `Candle / chained`: the same Candle time",
        "over our chained time (Candle quantizes on every call either way).",
        "",
        "| format | rows x cols | batch | weights MB | us | GB/s | % of copy | hot us | us +quantize | us chained (% of copy) | PyTorch bf16 us (% of copy) | Candle / ours (matvec alone) | Candle / chained |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rust:
        t = t_index.get((s["rows"], s["cols"], s["batch"]))
        c = c_index.get((s["dtype"], s["rows"], s["cols"], s["batch"]))
        tt = f"{t['us']:.1f} ({100 * t['moved'] / t['us'] / 1e3 / copy:.0f}%)" if t else "-"
        cc = f"{c['us'] / s['us_with_quantize']:.2f} ({c['us'] / s['us']:.2f})" if c else "not run"
        hot = f"{s['us_hot']:.1f}" if "us_hot" in s else "-"
        ch = f"{s['us_chained']:.1f} ({100 * s['moved'] / s['us_chained'] / 1e3 / copy:.0f}%)" if "us_chained" in s else "-"
        cch = f"{c['us'] / s['us_chained']:.2f}" if c and "us_chained" in s else "-"
        lines.append(f"| {s['dtype']} | {s['rows']}x{s['cols']} | {s['batch']} | {s['weight_bytes'] / 1e6:.1f} | {s['us']:.1f} | "
                     f"{s['gbps']:.0f} | {100 * s['gbps'] / copy:.0f}% | {hot} | {s['us_with_quantize']:.1f} | {ch} | {tt} | {cc} | {cch} |")
    if os.path.exists(f"{d}/read_ceiling.txt"):
        lines += ["", "Read ceiling (benches/cuda/read_ceiling.cu, same session):", "", "```"]
        lines += [l.rstrip() for l in open(f"{d}/read_ceiling.txt")]
        lines += ["```"]
    open(f"{d}/report_quantized.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
