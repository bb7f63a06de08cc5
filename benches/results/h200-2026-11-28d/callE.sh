# Session d call E (two H200s): issue 33. NCCL's small all-reduce latency under its settings
# (PyTorch, per call in a CUDA graph), and the 8B bf16 TP=2 decode at batch 1 under the
# same settings, TP=1 before and after.
set -u
O=$OUT/e; mkdir -p $O
B=$PWD/.device-bin
nvidia-smi > $O/gpu.txt 2>&1
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $O/summary.txt; }
M=/tmp/llama8b_bf16
(timeout 200 $B/llm-worker write-random --family llama --shape 8b --dtype bf16 --out $M > $O/write.log 2>&1; echo "write rc=$?" >> $O/write.log) &
wpid=$!
micro() { # micro TAG PORT ENV...
  local tag=$1 port=$2; shift 2
  env "$@" timeout 60 python3 .gpu-pack/nccl_graph.py $port > $O/nccl_$tag.jsonl 2> $O/nccl_$tag.err
  el "nccl $tag: $(python3 -c '
import json,sys
for l in open(sys.argv[1]):
  j=json.loads(l); print("%d B eager %.1f graph %.1f us;" % (j["bytes"], j["eager_us"], j["graph_us"]), end=" ")' $O/nccl_$tag.jsonl)"
}
micro default 29511 X=1
micro ll 29512 NCCL_PROTO=LL
micro ll_mix0 29513 NCCL_PROTO=LL NCCL_GRAPH_MIXING_SUPPORT=0
micro ll_mix0_ch2 29514 NCCL_PROTO=LL NCCL_GRAPH_MIXING_SUPPORT=0 NCCL_MAX_NCHANNELS=2
micro ll_ring_ch1 29515 NCCL_PROTO=LL NCCL_ALGO=Ring NCCL_MAX_NCHANNELS=1
wait $wpid; el "$(tail -1 $O/write.log)"
bench() { # bench TAG TP CONC ENV...
  local tag=$1 tp=$2 c=$3; shift 3
  env "$@" timeout 150 $B/llm-worker bench --model $M --device cuda:0 --tensor-parallel $tp --prompt-len 512 --gen 128 --concurrency $c > $O/bench_$tag.log 2>&1
  el "$tag: $(grep '^{' $O/bench_$tag.log | python3 -c '
import sys,json
for l in sys.stdin:
  j=json.loads(l); print("c=%d decode %.1f tok/s ttft %.1f ms;" % (j["concurrency"], j["decode_tok_s"], j["ttft_ms"]), end=" ")') $(grep -i error $O/bench_$tag.log | head -2)"
}
bench tp1 1 1 X=1
bench tp2 2 1 X=1
bench tp2_ll 2 1 NCCL_PROTO=LL
bench tp2_ll_mix0 2 1 NCCL_PROTO=LL NCCL_GRAPH_MIXING_SUPPORT=0
bench tp2_ll_mix0_ch2 2 1 NCCL_PROTO=LL NCCL_GRAPH_MIXING_SUPPORT=0 NCCL_MAX_NCHANNELS=2
bench tp2_b 2 1 X=1
bench tp1_b 1 1 X=1
cd $OUT && tar -czf e.tgz e
