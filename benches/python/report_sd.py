"""Builds report_sd.csv (issue 32) from the sd part of `nvidia.sh report`: `sd-worker bench`
lines (ours_*.jsonl), torch_sd.py's (torch_sd.jsonl) and `candle-peer sd`'s (candle_*.jsonl),
in one directory.

usage: report_sd.py DIR

One row per shape, op (unet_step, vae_decode) and backend (ours, torch, candle-cuda): median and best
time of the timed runs, and ratio_vs_ours = the backend's median time over ours (above 1 we
are faster; 1.00 on our rows). A row whose image size or batch differs from ours says so in
`note` and gets no ratio.
"""
import glob
import os
import sys

from reportlib import load_jsonl as load, print_markdown, write_csv

COLUMNS = ["shape", "op", "batch", "width", "height", "backend", "median_ms", "min_ms", "ratio_vs_ours", "note"]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    got = {}  # (shape, op, backend) -> the last line
    for path in sorted(glob.glob(os.path.join(d, "ours_*.jsonl"))):
        for r in load(path):
            if r["op"] == "vae_decode":
                # sd-worker decodes one latent; its line carries the UNet's batch.
                r["batch"] = 1
            got[(r["shape"], r["op"], "ours")] = r
    # Our UNet/VAE with every convolution on the implicit-GEMM kernel (CANDLE_ROCM_CONV=implicit).
    for path in sorted(glob.glob(os.path.join(d, "ours-implicit_*.jsonl"))):
        for r in load(path):
            if r["op"] == "vae_decode":
                r["batch"] = 1
            got[(r["shape"], r["op"], "ours-implicit")] = r
    tp = os.path.join(d, "torch_sd.jsonl")
    if os.path.exists(tp):
        for r in load(tp):
            got[(r["shape"], r["op"], r.get("backend", "torch"))] = r
    # Candle's own CUDA backend (`candle-peer sd`, benches/candle-peer/src/sd_e2e.rs).
    for path in sorted(glob.glob(os.path.join(d, "candle_*.jsonl"))):
        for r in load(path):
            got[(r["shape"], r["op"], r.get("backend", "candle-cuda"))] = r
    if not got:
        sys.exit(f"no SD results in {d}")
    rows = []
    for key in sorted(got, key=lambda k: (k[0], k[1], k[2] != "ours", k[2])):
        r = got[key]
        ours = got.get((key[0], key[1], "ours"))
        same = ours is not None and all(r[k] == ours[k] for k in ("width", "height", "batch"))
        note = ""
        if ours is None:
            note = "no run of ours"
        elif not same:
            note = f"size/batch differ from ours ({ours['width']}x{ours['height']}, batch {ours['batch']})"
        rows.append(dict(shape=key[0], op=key[1], batch=r["batch"], width=r["width"], height=r["height"], backend=key[2],
                         median_ms=f"{r['median_ms']:.2f}", min_ms=f"{r['min_ms']:.2f}",
                         ratio_vs_ours=f"{r['median_ms'] / ours['median_ms']:.2f}" if same else "", note=note))
    out = os.path.join(d, "report_sd.csv")
    write_csv(out, COLUMNS, rows)
    print_markdown(COLUMNS, rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
