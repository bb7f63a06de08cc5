"""The ops and shapes of the Rust `llm` bench in PyTorch, timed with CUDA events on the same
GPU: softmax, RMSNorm, LayerNorm, reductions, rotary embeddings (the reference rotary code
LLM implementations use: rotate-half for `rope`/`rope_thd`, pairwise for `rope_i`) and
indexing. Writes torch_llm.json.

usage: torch_llm.py [--out DIR] [--quick]
"""
import json

import torch
import torch.nn.functional as F

from torch_elementwise import peer_args, timed


def shape(*dims):
    return "x".join(str(d) for d in dims)


def main():
    args = peer_args()
    dev = torch.device("cuda")
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    samples = []

    def rec(op, dt, dims, moved, us):
        samples.append(dict(op=op, dtype=dt, shape=shape(*dims), moved=moved, us=us))
        print(f"{op:>16} {dt:<5} {shape(*dims):>16} {us:10.2f} us {moved / us / 1e3:8.1f} GB/s")

    cb = 256 << 20
    src = torch.empty(cb, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    rec("copy", "u8", [cb], 2 * cb, timed(lambda: dst.copy_(src), cb))
    del src, dst

    row_shapes = [(64, 4096), (4096, 4096)] if args.quick else [
        (1, 4096), (64, 4096), (4096, 4096), (64, 8192), (4096, 8192), (2048, 16384), (1024, 32768), (32768, 256)]
    for r, c in row_shapes:
        for name, dt in dtypes.items():
            sz = torch.tensor([], dtype=dt).element_size()
            x = torch.rand(r, c, dtype=dt, device=dev) * 8 - 4
            w = torch.rand(c, dtype=dt, device=dev)
            b = torch.rand(c, dtype=dt, device=dev)
            nb = r * c * sz
            rec("softmax", name, [r, c], 2 * nb, timed(lambda: torch.softmax(x, -1), nb))
            if hasattr(F, "rms_norm"):
                fn = lambda: F.rms_norm(x, (c,), w, 1e-5)
            else:
                fn = lambda: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(dt) * w
            rec("rms_norm", name, [r, c], 2 * nb + c * sz, timed(fn, nb))
            rec("layer_norm", name, [r, c], 2 * nb + 2 * c * sz, timed(lambda: F.layer_norm(x, (c,), w, b, 1e-5), nb))
            del x

    red_shapes = [(4096, 4096)] if args.quick else [(4096, 4096), (64, 32000)]
    for r, c in red_shapes:
        for name, dt in dtypes.items():
            sz = torch.tensor([], dtype=dt).element_size()
            x = torch.rand(r, c, dtype=dt, device=dev) * 8 - 4
            nb = r * c * sz
            rec("sum_last", name, [r, c], nb + r * sz, timed(lambda: x.sum(-1), nb))
            rec("max_last", name, [r, c], nb + r * sz, timed(lambda: x.amax(-1), nb))
            rec("sum_first", name, [r, c], nb + c * sz, timed(lambda: x.sum(0), nb))
            rec("argmax_last", name, [r, c], nb + r * 4, timed(lambda: x.argmax(-1), nb))

    rope_shapes = [(1, 4096)] if args.quick else [(1, 1), (64, 1), (1, 4096), (8, 1024)]
    h, d = 32, 128
    for bs, t in rope_shapes:
        for name, dt in dtypes.items():
            sz = torch.tensor([], dtype=dt).element_size()
            x = torch.rand(bs, h, t, d, dtype=dt, device=dev) * 8 - 4
            cos = torch.rand(t, d // 2, dtype=dt, device=dev)
            sin = torch.rand(t, d // 2, dtype=dt, device=dev)
            n = x.numel()
            moved = 2 * n * sz + t * d * sz

            def rope_half(x, cos, sin):
                # The rotate-half form of reference LLM code (Llama in transformers).
                c = torch.cat([cos, cos], -1)
                s = torch.cat([sin, sin], -1)
                x1, x2 = x[..., : d // 2], x[..., d // 2:]
                return x * c + torch.cat([-x2, x1], -1) * s

            def rope_inter(x, cos, sin):
                # Pairwise (GPT-J / interleaved) form.
                x1, x2 = x[..., 0::2], x[..., 1::2]
                return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

            rec("rope_i", name, [bs, h, t, d], moved, timed(lambda: rope_inter(x, cos, sin), n * sz))
            rec("rope", name, [bs, h, t, d], moved, timed(lambda: rope_half(x, cos, sin), n * sz))
            xt = x.transpose(1, 2).contiguous()
            ct, st = cos[:, None, :], sin[:, None, :]
            rec("rope_thd", name, [bs, t, h, d], moved, timed(lambda: rope_half(xt, ct, st), n * sz))
            del x, xt

    for n in ([4096] if args.quick else [64, 4096]):
        for name, dt in dtypes.items():
            sz = torch.tensor([], dtype=dt).element_size()
            vocab, hidden = 32000, 4096
            table = torch.rand(vocab, hidden, dtype=dt, device=dev)
            ids = (torch.arange(n, device=dev, dtype=torch.int64) * 2654435761) % vocab
            rec("index_select", name, [n, vocab, hidden], 2 * n * hidden * sz + n * 4,
                timed(lambda: torch.index_select(table, 0, ids), n * hidden * sz))
            del table
            if n < 4096:
                continue
            m = 4096 * 4096
            a = torch.rand(4096, 4096, dtype=dt, device=dev)
            b = torch.rand(4096, 4096, dtype=dt, device=dev)
            cond = (torch.arange(m, device=dev) * 7 % 3 == 0).reshape(4096, 4096)
            rec("where_cond", name, [4096, 4096], 3 * m * sz + m, timed(lambda: torch.where(cond, a, b), m * sz))
            parts = [torch.rand(4096, 1024, dtype=dt, device=dev) for _ in range(3)]
            rec("cat_dim1", name, [3, 4096, 1024], 2 * 3 * 4096 * 1024 * sz, timed(lambda: torch.cat(parts, 1), 3 * 4096 * 1024 * sz))
            sids = ((torch.arange(m, device=dev) // 4096) * 2654435761 % 4096).reshape(4096, 4096)
            y = torch.zeros(4096, 4096, dtype=dt, device=dev)
            rec("scatter_add", name, [4096, 4096], m * sz + m * 4 + 2 * m * sz, timed(lambda: y.scatter_add_(0, sids, a), m * sz))
            if name == "f32":
                # PyTorch's scatter_add_ is itself unordered (atomics): the fair peer for ours.
                rec("scatter_add_unordered", name, [4096, 4096], 4 * m * sz, timed(lambda: y.scatter_add_(0, sids, a), m * sz))
            del a, b, parts, y

    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, samples=samples)
    with open(f"{args.out}/torch_llm.json", "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}/torch_llm.json")


if __name__ == "__main__":
    main()
