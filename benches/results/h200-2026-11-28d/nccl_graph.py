"""NCCL all-reduce latency on 2 GPUs through PyTorch: per call, eager and inside a CUDA graph
of 64 back-to-back calls (what a TP=2 decode step of an 8B llama holds), for the decode
shapes (hidden 4096, bf16: 1, 8 and 64 rows). One process per GPU. JSON line per size."""
import json, os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

SIZES = [4096, 8 * 4096, 64 * 4096]

def run(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    for n in SIZES:
        x = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        for _ in range(20):
            dist.all_reduce(x)
        torch.cuda.synchronize(); dist.barrier()
        t = time.perf_counter()
        for _ in range(640):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        eager = (time.perf_counter() - t) / 640 * 1e6
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                dist.all_reduce(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(64):
                dist.all_reduce(x)
        torch.cuda.synchronize(); dist.barrier()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize(); dist.barrier()
        t = time.perf_counter()
        for _ in range(50):
            g.replay()
        torch.cuda.synchronize()
        graph = (time.perf_counter() - t) / 50 / 64 * 1e6
        if rank == 0:
            print(json.dumps({"elements": n, "bytes": 2 * n, "eager_us": round(eager, 2), "graph_us": round(graph, 2), "nccl": ".".join(map(str, torch.cuda.nccl.version())), "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}), flush=True)
        dist.barrier()
    torch.cuda.synchronize()
    os._exit(0)

if __name__ == "__main__":
    mp.spawn(run, args=(2, int(sys.argv[1]) if len(sys.argv) > 1 else 29511), nprocs=2)
