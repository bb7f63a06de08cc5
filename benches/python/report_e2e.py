"""End-to-end llama (candle-transformers, 1B-shaped, random weights) on candle-rocm against
Candle's own CUDA backend, from the JSON lines both sides print (`llama_e2e`, `candle-peer`).

usage: report_e2e.py OURS.jsonl PEER.jsonl [OURS_KERNEL_GEMM.jsonl]

Each side runs a warm-up pass, then `--reps` timed runs of prefill + greedy decode. The first
timed run still pays one-time costs on both sides (allocator growth, BLAS heuristics for new
shapes), so the table gives the median over runs 1.. (all runs when there is only one) and
every run's figures beside it; ratio = ours / Candle's tokens per second (above 1: faster).
"""
import statistics
import sys

from reportlib import load_jsonl


def load(path):
    return load_jsonl(path, skip_bad=False)


def median(rows, key):
    use = rows[1:] if len(rows) > 1 else rows
    return statistics.median(r[key] for r in use)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ours, peer = load(sys.argv[1]), load(sys.argv[2])
    if not ours or not peer:
        sys.exit("no runs in one of the inputs")
    extra = load(sys.argv[3]) if len(sys.argv) > 3 else []
    r0 = ours[0]
    what = r0.get("model") or f"llama 1B-shaped, {r0['dtype']}"
    print(f"{what}, prompt {r0['prompt']} tokens, {r0['steps']} decode steps")
    print()
    print("| backend | prefill tok/s (median) | decode tok/s (median) | runs: prefill / decode |")
    print("|---|---|---|---|")
    for name, rows in [("candle-rocm (ours)", ours), ("Candle CUDA", peer)] + ([("ours, CANDLE_ROCM_BLAS=0", extra)] if extra else []):
        runs = ", ".join(f"{r['prefill_tok_s']:.0f} / {r['decode_tok_s']:.1f}" for r in rows)
        print(f"| {name} | {median(rows, 'prefill_tok_s'):.0f} | {median(rows, 'decode_tok_s'):.1f} | {runs} |")
    print()
    print(f"ours / Candle CUDA: prefill {median(ours, 'prefill_tok_s') / median(peer, 'prefill_tok_s'):.2f}x, "
          f"decode {median(ours, 'decode_tok_s') / median(peer, 'decode_tok_s'):.2f}x")


if __name__ == "__main__":
    main()
