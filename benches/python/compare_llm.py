"""Compares two report_llm.csv files (old run, new run): per row the PyTorch-time / ours
ratio of each, then the rows below 0.95 in the new run and the counts.

usage: compare_llm.py OLD.csv NEW.csv
"""
import csv
import sys


def load(p):
    return {(r["op"], r["dtype"], r["shape"]): r for r in csv.DictReader(open(p))}


def main():
    old, new = load(sys.argv[1]), load(sys.argv[2])
    print(f"{'op':24} {'dtype':5} {'shape':18} {'old us':>9} {'new us':>9} {'old ratio':>9} {'new ratio':>9}")
    below = 0
    for k, n in new.items():
        o = old.get(k)
        nr = float(n["torch_over_rust"])
        below += nr < 0.95
        orat = float(o["torch_over_rust"]) if o else float("nan")
        ous = float(o["rust_us"]) if o else float("nan")
        mark = " <" if nr < 0.95 else ""
        print(f"{k[0]:24} {k[1]:5} {k[2]:18} {ous:9.2f} {float(n['rust_us']):9.2f} {orat:9.2f} {nr:9.2f}{mark}")
    ok = sum(float(n["torch_over_rust"]) >= 1.0 for n in new.values())
    print(f"new run: {len(new)} rows, {ok} at least as fast as PyTorch, {below} below 0.95")


if __name__ == "__main__":
    main()
