#!/usr/bin/env python3
"""Draws the benchmark charts of README.md and docs/benchmarks.md from the committed reports.

    python3 benches/python/plots.py [--out benches/results/plots]

Python 3 only (no matplotlib): each chart is a horizontal bar chart written as SVG by hand.
Inputs (the reports the book quotes; change the paths below when a newer run replaces one):

- elementwise: benches/results/report.csv
- LLM families: benches/results/h100-2026-11-24h/final-llm/report_llm.csv
- quantized matvec: benches/results/h100-2026-11-25o/final/quantized/report_quantized.md
- GEMM: benches/results/h100-2026-11-25m/final/gemm/report_gemm.md

It also prints the summary figures the book quotes (rows at least as fast as the peer,
geometric means), so they can be checked against the same files.
"""
import argparse
import csv
import html
import math
import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
RESULTS = os.path.join(ROOT, "benches", "results")
ELEMENTWISE = os.path.join(RESULTS, "report.csv")
LLM = os.path.join(RESULTS, "h100-2026-11-24h", "final-llm", "report_llm.csv")
QUANTIZED = os.path.join(RESULTS, "h100-2026-11-25o", "final", "quantized", "report_quantized.md")
GEMM = os.path.join(RESULTS, "h100-2026-11-25m", "final", "gemm", "report_gemm.md")

COLORS = ["#3b6fb6", "#e08a2c", "#4a9b5b", "#b04a5a"]


def rel(path):
    return os.path.relpath(path, ROOT)


def size_label(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def markdown_table(path):
    """The first Markdown table of `path` as a list of dicts keyed by the header cells."""
    rows, header = [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("|"):
                if header is not None:
                    break
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not all(set(c) <= set("-: ") for c in cells):
                rows.append(dict(zip(header, cells)))
    return rows


def number(cell):
    """The leading number of a cell such as `5.9 (54%)`, `42%`, `1.19 (1.80)` or `-`."""
    head = cell.replace("**", "").split("(")[0].strip().rstrip(")%x").replace(",", "")
    try:
        return float(head)
    except ValueError:
        return None


def hbar(path, title, subtitle, rows, series, ref=None, ref_label="", unit=""):
    """A horizontal bar chart: `rows` is [(label, [value per series])]; a value may be None."""
    bar, gap, left, right = 9, 5, 230, 70
    top = 62 + 13 * subtitle.count("\n")
    group = bar * len(series) + gap
    width = 900
    height = top + group * len(rows) + 40
    vmax = max([v for _, vs in rows for v in vs if v is not None] + [ref or 0]) * 1.08
    plot_w = width - left - right

    def x(v):
        return left + plot_w * v / vmax

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="15" font-weight="bold">{html.escape(title)}</text>',
    ]
    for i, line in enumerate(subtitle.split("\n")):
        out.append(f'<text x="{left}" y="{35 + 13 * i}" fill="#555">{html.escape(line)}</text>')
    # Legend.
    lx = left
    for i, name in enumerate(series):
        out.append(f'<rect x="{lx}" y="{top - 17}" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{lx + 14}" y="{top - 8}">{html.escape(name)}</text>')
        lx += 20 + 7 * len(name)
    # Grid.
    step = 10 ** math.floor(math.log10(vmax / 2)) if vmax > 0 else 1
    if vmax / step > 10:
        step *= 2
    t = 0.0
    while t <= vmax:
        out.append(f'<line x1="{x(t):.1f}" y1="{top - 4}" x2="{x(t):.1f}" y2="{height - 34}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{x(t):.1f}" y="{height - 20}" text-anchor="middle" fill="#555">{t:g}{unit}</text>')
        t += step
    y = top
    for label, values in rows:
        out.append(f'<text x="{left - 6}" y="{y + group / 2 + 1:.1f}" text-anchor="end">{html.escape(label)}</text>')
        for i, v in enumerate(values):
            if v is None:
                continue
            by = y + i * bar
            out.append(
                f'<rect x="{left}" y="{by}" width="{max(x(v) - left, 0.5):.1f}" height="{bar - 1}" '
                f'fill="{COLORS[i % len(COLORS)]}"><title>{html.escape(label)}, {html.escape(series[i])}: {v:g}{unit}</title></rect>'
            )
            out.append(f'<text x="{x(v) + 3:.1f}" y="{by + bar - 2}" font-size="9" fill="#333">{v:g}</text>')
        y += group
    if ref is not None:
        out.append(f'<line x1="{x(ref):.1f}" y1="{top - 4}" x2="{x(ref):.1f}" y2="{height - 34}" stroke="#c0392b" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x(ref) + 3:.1f}" y="{top - 8}" fill="#c0392b">{html.escape(ref_label)}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {rel(path)} ({len(rows)} rows)")


def elementwise(out):
    rows = list(csv.DictReader(open(ELEMENTWISE)))
    label = lambda r: f"{r['op']} {r['dtype']} {size_label(int(r['bytes']))}"
    hbar(
        os.path.join(out, "elementwise_ratio.svg"),
        "Elementwise: PyTorch time / ours (above 1: ours faster)",
        f"NVIDIA H100, PyTorch 2.11, same run\n{rel(ELEMENTWISE)}",
        [(label(r), [float(r["torch_over_rust"])]) for r in rows],
        ["PyTorch time / ours"],
        ref=1.0,
        ref_label="parity",
    )
    big = [r for r in rows if int(r["bytes"]) >= 64 << 20]
    hbar(
        os.path.join(out, "elementwise_pct_of_copy.svg"),
        "Elementwise: % of device-copy bandwidth (64 MiB and larger)",
        f"NVIDIA H100; bytes read + written / time over a same-run device copy\n{rel(ELEMENTWISE)}",
        [(label(r), [float(r["pct_of_copy"])]) for r in big],
        ["ours"],
        ref=100.0,
        ref_label="copy",
        unit="%",
    )


def llm(out):
    rows = list(csv.DictReader(open(LLM)))
    label = lambda r: f"{r['op']} {r['dtype']} {r['shape']}"
    ratios = [float(r["torch_over_rust"]) for r in rows]
    # Bytes moved = GB/s * us * 1e3; the geometric mean is over shapes of at least 16 MiB.
    big = [float(r["torch_over_rust"]) for r in rows if float(r["rust_gbps"]) * float(r["rust_us"]) * 1e3 >= 16 << 20]
    print(
        f"LLM families ({rel(LLM)}): {len(rows)} rows, {sum(v >= 1.0 for v in ratios)} at least as fast as PyTorch, "
        f"{sum(v < 0.95 for v in ratios)} below 0.95, lowest {min(ratios):.3f}; geometric mean over the "
        f"{len(big)} shapes of at least 16 MiB {math.exp(sum(map(math.log, big)) / len(big)):.2f}"
    )
    hbar(
        os.path.join(out, "llm_ratio.svg"),
        "LLM families: PyTorch time / ours (above 1: ours faster)",
        f"NVIDIA H100, PyTorch 2.11, same run\n{rel(LLM)}",
        [(label(r), [float(r["torch_over_rust"])]) for r in rows],
        ["PyTorch time / ours"],
        ref=1.0,
        ref_label="parity",
    )
    hbar(
        os.path.join(out, "llm_pct_of_copy.svg"),
        "LLM families: % of device-copy bandwidth",
        f"NVIDIA H100; bytes an ideal kernel moves / time over a same-run copy\n{rel(LLM)}",
        [(label(r), [float(r["pct_of_copy"])]) for r in rows],
        ["ours"],
        ref=100.0,
        ref_label="copy",
        unit="%",
    )


def quantized(out):
    rows = markdown_table(QUANTIZED)
    b1 = [r for r in rows if r["batch"] == "1"]
    label = lambda r: f"{r['format']} {r['rows x cols']}" + ("" if r["batch"] == "1" else f" batch {r['batch']}")
    chained = lambda r: number(r["us chained (% of copy)"].split("(")[1].rstrip(")")) if "(" in r["us chained (% of copy)"] else None
    hbar(
        os.path.join(out, "quantized_pct_of_copy.svg"),
        "GGUF matvec, batch 1: % of device-copy bandwidth (weights from DRAM)",
        f"NVIDIA H100; alone = on q8_1 activations, chained = ops::matvec after a matvec on the same input\n{rel(QUANTIZED)}",
        [(label(r), [number(r["% of copy"]), chained(r)]) for r in b1],
        ["alone", "chained"],
        ref=100.0,
        ref_label="copy",
        unit="%",
    )
    hbar(
        os.path.join(out, "quantized_vs_candle.svg"),
        "GGUF matvec: Candle CUDA time / ours (above 1: ours faster)",
        f"NVIDIA H100, Candle 0.11.1 QMatMul::forward, same run; like for like (quantization + matvec) and chained\n{rel(QUANTIZED)}",
        [(label(r), [number(r["Candle / ours (matvec alone)"]), number(r["Candle / chained"])]) for r in rows],
        ["Candle / ours", "Candle / ours chained"],
        ref=1.0,
        ref_label="parity",
    )


def gemm(out):
    rows = markdown_table(GEMM)
    rows = [r for r in rows if number(r["torch.matmul TFLOP/s"])]
    hbar(
        os.path.join(out, "gemm_vs_cublas.svg"),
        "GEMM: ours / cuBLAS throughput (1 = cuBLAS)",
        f"NVIDIA H100, cuBLAS through PyTorch 2.11 torch.matmul, same run\n{rel(GEMM)}",
        [(f"{r['dtype']} {r['M x N x K']}", [number(r["tiled / torch"]), number(r["wgmma / torch"])]) for r in rows],
        ["gemm_tiled (mma.sync) / cuBLAS", "gemm_wgmma / cuBLAS"],
        ref=1.0,
        ref_label="cuBLAS",
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(RESULTS, "plots"), help="output folder (default: benches/results/plots)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    elementwise(a.out)
    llm(a.out)
    quantized(a.out)
    gemm(a.out)


if __name__ == "__main__":
    main()
