"""PyTorch peer of `llm-worker bench` (the serving engine's decode benchmark): loads the same
random-weight safetensors folder that `llm-worker write-random` writes with `transformers`,
feeds random prompts of `--prompt-len` tokens and generates exactly `--gen` tokens greedily
(`min_new_tokens` = `max_new_tokens`, so a random EOS never ends a sequence early).

Modes (`--modes`, backend names of report_engine.csv):
- `torch`: eager `generate` with the default dynamic cache, at every `--concurrency` (one
  batched `generate` of that many equal-length prompts; the attention mask is passed, so
  the padding path runs, with nothing to pad since every prompt has the same length).
- `torch-compile`: `generate` with a static cache and `torch.compile` of the decode step
  (`compile_config`: full graph, mode reduce-overhead = CUDA graphs), at
  `--compile-concurrency` (default 1: each batch size is its own compilation). A failure
  to compile is recorded as a JSON line with `error`, never replaced by eager figures; a run
  where no graph was compiled is recorded as an error too.

Timing: a streamer synchronises the GPU and stamps the host clock at every generated token
(`generate` already waits for the GPU at every step for its stopping check). TTFT is the
time from the `generate` call to the first token (prefill of the whole batch); decode tok/s
is the aggregate rate after it, `concurrency * (gen - 1) / (last token - first token)`, as
`llm-worker bench` counts tokens after the last first token. One untimed run of the same
call first (compilation, CUDA graph capture, cuBLAS heuristics), then `--reps` timed runs.

`copy` subcommand: the same-run copy bandwidth (1 GiB device-to-device, bytes read + written)
that report_engine.py divides by, into DIR/copy.json.

usage: torch_engine.py --model DIR --tag 1b-bf16 [--out DIR] [--prompt-len 512] [--gen 256]
                       [--concurrency 1,8,32,64] [--modes torch,torch-compile]
                       [--compile-concurrency 1] [--reps 2]
       torch_engine.py copy [--out DIR]
Writes DIR/torch_TAG.jsonl (TAG with underscores: torch_1b_bf16.jsonl), one line per mode,
concurrency and run, and prints the lines.
"""
import argparse
import json
import os
import sys
import time
import traceback

import torch


def ints(s):
    return [int(x) for x in s.split(",") if x]


def copy_bandwidth(out):
    """Device-to-device copy of 1 GiB, median of 5 timed runs of 10 copies, GB/s counting
    the bytes read and written (the same measure as the Rust benches' `copy 1 GiB`)."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    reps = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            dst.copy_(src)
        b.record()
        b.synchronize()
        reps.append(a.elapsed_time(b) / 10 * 1e-3)
    reps.sort()
    s = reps[len(reps) // 2]
    j = dict(copy_gbps=2 * n / s / 1e9, bytes=n, seconds=s, device=torch.cuda.get_device_name(), torch=torch.__version__)
    print(json.dumps(j))
    with open(os.path.join(out, "copy.json"), "w") as f:
        json.dump(j, f)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Clock:
    """A `generate` streamer: the first `put` is the prompt, each later one a new token."""

    def __init__(self):
        self.times = []
        self.prompt_seen = False

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        sync()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def compiled_graphs():
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"].get("unique_graphs", 0))
    except Exception:
        return -1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "copy":
        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("--out", default=".")
        copy_bandwidth(p.parse_args().out)
        return
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="folder written by llm-worker write-random")
    p.add_argument("--tag", required=True, help="model name in the report (1b-bf16, 8b-bf16)")
    p.add_argument("--out", default=".")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen", type=int, default=256)
    p.add_argument("--concurrency", type=ints, default=[1, 8, 32, 64])
    p.add_argument("--compile-concurrency", type=ints, default=[1])
    p.add_argument("--modes", default="torch,torch-compile")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda (default); cpu to check the script without a GPU")
    args = p.parse_args()
    if args.prompt_len < 1 or args.gen < 2 or args.reps < 1:
        sys.exit("--prompt-len >= 1, --gen >= 2 and --reps >= 1")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("torch", "torch-compile"):
            sys.exit(f"unknown mode {m!r} (torch, torch-compile)")

    import transformers
    from transformers import AutoModelForCausalLM

    out_path = os.path.join(args.out, f"torch_{args.tag.replace('-', '_')}.jsonl")
    sink = open(out_path, "a")
    dev_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    base = dict(model=args.tag, prompt_len=args.prompt_len, gen=args.gen, device=dev_name,
                torch=torch.__version__, transformers=transformers.__version__)

    def emit(**kw):
        line = json.dumps({**base, **kw})
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map=args.device)
    except Exception as e:  # every requested row says why it has no figures
        traceback.print_exc()
        for mode in modes:
            for c in (args.compile_concurrency if mode == "torch-compile" else args.concurrency):
                emit(backend=mode, concurrency=c, error=f"loading the model failed: {type(e).__name__}: {e}"[:2000])
        sys.exit(1)
    model.eval()
    load_s = time.perf_counter() - t0
    cfg = model.config
    print(f"loaded {args.model} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, "
          f"attention {getattr(cfg, '_attn_implementation', '?')}) in {load_s:.1f} s", file=sys.stderr)
    vocab = cfg.vocab_size
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else 0
    gen_cpu = torch.Generator().manual_seed(args.seed)

    def run_once(c, compiled):
        ids = torch.randint(0, vocab - 2, (c, args.prompt_len), generator=gen_cpu).to(args.device)
        mask = torch.ones_like(ids)
        kw = dict(max_new_tokens=args.gen, min_new_tokens=args.gen, do_sample=False, pad_token_id=eos)
        if compiled:
            from transformers import CompileConfig
            cc = CompileConfig(fullgraph=True, mode="reduce-overhead", dynamic=False)
            if not args.device.startswith("cuda"):
                cc._compile_all_devices = True  # generate compiles on CUDA only unless told
            kw.update(cache_implementation="static", compile_config=cc)
        else:
            kw.update(disable_compile=True)
        clock = Clock()
        sync()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, streamer=clock, **kw)
        sync()
        end = time.perf_counter()
        got = out.shape[1] - args.prompt_len
        if got != args.gen or len(clock.times) != args.gen:
            raise RuntimeError(f"generated {got} tokens ({len(clock.times)} stamps), expected {args.gen}")
        ttft = clock.times[0] - start
        decode = c * (args.gen - 1) / (clock.times[-1] - clock.times[0])
        return dict(decode_tok_s=decode, ttft_ms=ttft * 1e3, seconds=end - start, output_tok_s=c * args.gen / (end - start))

    for mode in modes:
        compiled = mode == "torch-compile"
        for c in (args.compile_concurrency if compiled else args.concurrency):
            try:
                graphs0 = compiled_graphs()
                t = time.perf_counter()
                run_once(c, compiled)  # warm-up: compilation, graph capture, heuristics
                warm_s = time.perf_counter() - t
                graphs = compiled_graphs() - graphs0 if graphs0 >= 0 else -1
                if compiled and graphs == 0:
                    raise RuntimeError("generate compiled no graph (static cache set, compile_config given)")
                for rep in range(args.reps):
                    r = run_once(c, compiled)
                    emit(backend=mode, concurrency=c, rep=rep, warmup_s=warm_s, compiled_graphs=graphs, **r)
                    print(f"{args.tag} {mode} c={c} rep {rep}: decode {r['decode_tok_s']:.1f} tok/s, "
                          f"TTFT {r['ttft_ms']:.1f} ms (warm-up {warm_s:.1f} s)", file=sys.stderr)
            except Exception as e:  # recorded, not hidden: the report shows the failure
                traceback.print_exc()
                emit(backend=mode, concurrency=c, error=f"{type(e).__name__}: {e}"[:2000])
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    sink.close()


if __name__ == "__main__":
    main()
