#!/usr/bin/env python3
"""Markdown table of registers per architecture from a kernel build report.

    python3 tests/gpu/register_table.py REPORT KERNEL [KERNEL...]

REPORT is a crate's `$OUT_DIR/kernel_report.txt` (written by build-support: one line per
kernel instance and architecture with VGPR, AGPR, SGPR, LDS, scratch, spills, occupancy).
Each cell is `vgpr/sgpr, waves per SIMD`; a kernel with spills or scratch is marked.
"""
import sys

ARCHS = ["gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201"]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = {}
    with open(sys.argv[1]) as f:
        for line in f:
            p = line.split()
            if len(p) == 9 and p[1] in ARCHS and p[2].isdigit():
                sym, arch, vgpr, _agpr, sgpr, _lds, scratch, spills, occ = p
                cell = f"{vgpr}/{sgpr}, {occ}"
                if scratch != "0" or spills != "0":
                    cell += f" (scratch {scratch}, spills {spills})"
                rows.setdefault(sym, {})[arch] = cell
    print("| kernel | " + " | ".join(ARCHS) + " |")
    print("|---" * (len(ARCHS) + 1) + "|")
    for k in sys.argv[2:]:
        if k not in rows:
            sys.exit(f"{k}: not in {sys.argv[1]}")
        print(f"| `{k}` | " + " | ".join(rows[k].get(a, "-") for a in ARCHS) + " |")


if __name__ == "__main__":
    main()
