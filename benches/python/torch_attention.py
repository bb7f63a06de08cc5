"""PyTorch SDPA on the shapes of the Rust `attention` bench, timed with CUDA events on the
same GPU. Writes torch_attention.json.

- Prefill: torch.nn.functional.scaled_dot_product_attention on q, k, v laid out as ours
  ([batch, seq, heads, d], passed as transposed views), once with the flash backend
  (peer `sdpa-flash`) and once with the cuDNN backend (`sdpa-cudnn`), each forced through
  torch.nn.attention.sdpa_kernel; a backend that refuses a shape is recorded as skipped.
- Decode (`sdpa-gathered`): the paged cache ([num_blocks, block_size, kv_heads, d], bf16,
  block size 16) is gathered through the block table into [batch, kv_heads, ctx, d] and
  SDPA runs over it (q [batch, heads, 1, d], enable_gqa; torch picks the backend). Two
  times per shape: `us` is SDPA alone over the already gathered cache (the peer value of
  the report: a dense decode, the stricter comparison) and `us_with_gather` is gather +
  SDPA (what a paged cache costs PyTorch). As in the Rust bench, block tables cycle through
  copies of the cache region (256 MiB at least) so that K/V come from DRAM; the gathered
  tensors cycle the same way.

usage: torch_attention.py [--out DIR] [--quick] [--only prefill|decode]
"""
import json
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_elementwise import events_us, peer_args

COLD_BYTES = 256 << 20


def timed(fn):
    """Median microseconds per call: 5 repetitions of about 30 ms each."""
    fn()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    one = max(a.elapsed_time(b), 1e-3)
    fn()
    iters = min(max(int(30.0 / one), 3), 200)
    reps = []
    for _ in range(5):
        reps.append(events_us(fn, iters, a, b))
    return statistics.median(reps)


def prefill(samples, batch, heads, seq, d, causal):
    dev = torch.device("cuda")
    shape = (batch, seq, heads, d)
    q, k, v = (torch.rand(shape, dtype=torch.bfloat16, device=dev) * 2 - 1 for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    flops = 4 * batch * heads * seq * seq * d / (2 if causal else 1)
    ref = None
    for peer, backend in [("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)]:
        row = dict(kind="prefill", peer=peer, dtype="bf16", causal=causal, batch=batch, heads=heads, kv_heads=heads, seq=seq, head_dim=d)
        try:
            with sdpa_kernel([backend]):
                fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                o = fn()
                # The two backends agree (a guard against timing a wrong result).
                if ref is None:
                    ref = o.float()
                else:
                    err = (o.float() - ref).abs().max().item()
                    assert err < 0.02, f"{peer} differs from sdpa-flash by {err}"
                us = timed(fn)
            row.update(us=us, tflops=flops / us / 1e6)
            print(f"{peer:<11} causal {causal!s:<5} b {batch:>2} h {heads:>2} s {seq:>5} d {d:>3} {us:10.1f} us {flops / us / 1e6:7.1f} TFLOP/s")
        except Exception as e:  # a backend that does not take the shape
            row.update(skipped=str(e).splitlines()[0][:200])
            print(f"{peer} b {batch} s {seq} d {d} causal {causal}: skipped ({row['skipped']})")
        samples.append(row)


def decode(samples, batch, heads, kv_heads, ctx, d, bs):
    dev = torch.device("cuda")
    per_seq = -(-ctx // bs)
    used = batch * per_seq
    kv_bytes = 2 * used * bs * kv_heads * d * 2
    copies = min(max(-(-COLD_BYTES // kv_bytes), 1), 64)
    kc = torch.rand(used * copies, bs, kv_heads, d, dtype=torch.bfloat16, device=dev) * 2 - 1
    vc = torch.rand_like(kc) * 2 - 1
    q = torch.rand(batch, heads, 1, d, dtype=torch.bfloat16, device=dev) * 2 - 1
    stride = next(s for s in range(7, 1 << 30, 2) if math.gcd(s, used) == 1)
    base = (torch.arange(used, device=dev) * stride) % used
    tables = [(c * used + base).view(batch, per_seq) for c in range(copies)]

    def gather(t, c):
        x = t[tables[c]]  # [batch, per_seq, bs, kv_heads, d]
        return x.view(batch, per_seq * bs, kv_heads, d)[:, :ctx].transpose(1, 2)

    turn = [0]

    def with_gather():
        turn[0] += 1
        c = turn[0] % copies
        return F.scaled_dot_product_attention(q, gather(kc, c), gather(vc, c), enable_gqa=True)

    # Gathered copies for the SDPA-only timing (each a dense [batch, kv_heads, ctx, d]),
    # as many as fit the cold-cache rule without exceeding 8 GiB.
    n_dense = max(1, min(copies, (8 << 30) // kv_bytes))
    dense = [(gather(kc, c).contiguous(), gather(vc, c).contiguous()) for c in range(n_dense)]
    turn2 = [0]

    def sdpa_only():
        turn2[0] += 1
        k, v = dense[turn2[0] % n_dense]
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    # Both forms agree.
    err = (with_gather().float() - F.scaled_dot_product_attention(q, *(gather(x, turn[0] % copies) for x in (kc, vc)), enable_gqa=True).float()).abs().max().item()
    assert err < 1e-2, err
    us = timed(sdpa_only)
    us_g = timed(with_gather)
    nbytes = kv_bytes + 2 * batch * heads * d * 2
    samples.append(dict(kind="decode", peer="sdpa-gathered", dtype="bf16", causal=False, batch=batch, heads=heads, kv_heads=kv_heads,
                        seq=ctx, head_dim=d, block_size=bs, bytes=nbytes, us=us, gbps=nbytes / us / 1e3,
                        us_with_gather=us_g, gbps_with_gather=nbytes / us_g / 1e3))
    print(f"sdpa-gathered b {batch:>2} ctx {ctx:>5} {us:10.1f} us {nbytes / us / 1e3:7.1f} GB/s (with gather {us_g:.1f} us, {nbytes / us_g / 1e3:.1f} GB/s)")
    del kc, vc, dense
    torch.cuda.empty_cache()


def main():
    args = peer_args(("--only", dict(choices=["prefill", "decode"])))
    print(torch.__version__, torch.version.cuda, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    samples = []
    if args.only != "decode":
        seqs = [1024, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
        for d, heads in [(128, 16), (64, 32)]:
            for causal in [False, True]:
                for seq in seqs:
                    prefill(samples, max(8192 // seq, 1), heads, seq, d, causal)
    copy_gbps = None
    if args.only != "prefill":
        n = 1 << 30
        src = torch.empty(n, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_gbps = 2 * n / timed(lambda: dst.copy_(src)) / 1e3
        print(f"copy 1 GiB: {copy_gbps:.1f} GB/s")
        del src, dst
        batches = [1, 16] if args.quick else [1, 4, 16, 32, 64]
        ctxs = [1024, 4096] if args.quick else [1024, 4096, 16384, 32768]
        for b in batches:
            for ctx in ctxs:
                if b * ctx <= 1 << 20:
                    decode(samples, b, 32, 8, ctx, 128, 16)
    with open(f"{args.out}/torch_attention.json", "w") as f:
        json.dump(dict(torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                       device=torch.cuda.get_device_name(), copy_gbps=copy_gbps, samples=samples), f, indent=1)


if __name__ == "__main__":
    main()
