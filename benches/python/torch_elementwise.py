"""The same elementwise ops and sizes as the Rust `elementwise` bench, in PyTorch, timed with
CUDA events on the same GPU. Writes torch_elementwise.json.

usage: torch_elementwise.py [--out DIR] [--max-bytes N] [--quick]
"""
import argparse
import json
import statistics

import torch


def events_us(fn, iters, a=None, b=None):
    """Microseconds per call of `iters` back-to-back calls of `fn` between the CUDA events
    `a` and `b` (two new ones where not given)."""
    if a is None:
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters * 1e3


def timed(fn, nbytes):
    iters = 10 if nbytes >= 64 << 20 else 50 if nbytes >= 1 << 20 else 200
    for _ in range(3):
        fn()
    reps = []
    for _ in range(5):
        reps.append(events_us(fn, iters))
    return statistics.median(reps)


def peer_args(*extra):
    """The parsed command line of a PyTorch peer script: `--out DIR` (default `.`), `--quick`,
    then each `(flag, argparse options)` of `extra`."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--quick", action="store_true")
    for flag, options in extra:
        p.add_argument(flag, **options)
    return p.parse_args()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    dev = torch.device("cuda")
    samples = []
    nbytes = 4096
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    while nbytes <= args.max_bytes:
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        us = timed(lambda: dst.copy_(src), nbytes)
        samples.append(dict(op="copy", dtype="u8", bytes=nbytes, moved=2 * nbytes, us=us))
        del src, dst
        for name, dt in dtypes.items():
            n = nbytes // torch.tensor([], dtype=dt).element_size()
            x = torch.rand(n, dtype=dt, device=dev)
            y = torch.rand(n, dtype=dt, device=dev)
            out = torch.empty_like(x)
            half_t = torch.full((), 0.5, dtype=dt, device=dev)
            mul_t = torch.full((), 1.5, dtype=dt, device=dev)
            cases = [
                # x * 1.5 + 0.5 in one kernel (addcmul with scalar tensors).
                ("affine", 2, lambda: torch.addcmul(half_t, x, mul_t, out=out)),
                ("binary_add", 3, lambda: torch.add(x, y, out=out)),
                ("unary_exp", 2, lambda: torch.exp(x, out=out)),
            ]
            if not args.quick:
                if name == "f32":
                    cases.append(("unary_gelu_erf", 2, lambda: torch.nn.functional.gelu(x)))
                else:
                    cases.append(("unary_silu", 2, lambda: torch.nn.functional.silu(x)))
            for op, k, fn in cases:
                us = timed(fn, nbytes)
                samples.append(dict(op=op, dtype=name, bytes=nbytes, moved=k * nbytes, us=us))
            del x, y, out
        nbytes *= 16 if args.quick else 4

    # Launch overhead: the smallest kernel PyTorch can launch (fill of one element).
    t = torch.empty(1, device=dev)
    for _ in range(100):
        t.fill_(1.0)
    reps = []
    for _ in range(5):
        reps.append(events_us(lambda: t.fill_(1.0), 2000))
    launch_us = statistics.median(reps)
    for s in samples:
        s["gbps"] = s["moved"] / (s["us"] * 1e-6) / 1e9
    path = f"{args.out}/torch_elementwise.json"
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, launch_us=launch_us, samples=samples), f, indent=1)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: launch {launch_us:.2f} us; wrote {path}")


if __name__ == "__main__":
    main()
