# Session d call F (two H200s): issue 33. The 8B bf16 TP=2 decode with every collective
# skipped (LLM_TP_SKIP_COLLECTIVES=1: the step's time without them), against the real
# TP=2 and TP=1, batch 1 and 64.
set -u
O=$OUT/f; mkdir -p $O
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
wait $wpid; el "$(tail -1 $O/write.log)"
bench() { # bench TAG TP CONC ENV...
  local tag=$1 tp=$2 c=$3; shift 3
  env "$@" timeout 150 $B/llm-worker bench --model $M --device cuda:0 --tensor-parallel $tp --prompt-len 512 --gen 128 --concurrency $c > $O/bench_$tag.log 2>&1
  el "$tag: $(grep '^{' $O/bench_$tag.log | python3 -c '
import sys,json
for l in sys.stdin:
  j=json.loads(l); print("c=%d decode %.1f tok/s ttft %.1f ms;" % (j["concurrency"], j["decode_tok_s"], j["ttft_ms"]), end=" ")') $(grep -i error $O/bench_$tag.log | head -2)"
}
bench tp2_skip 2 1,64 LLM_TP_SKIP_COLLECTIVES=1
bench tp2 2 1,64 X=1
bench tp1 1 1,64 X=1
bench tp2_skip_b 2 1 LLM_TP_SKIP_COLLECTIVES=1
bench tp2_ll_mix0 2 1,64 NCCL_PROTO=LL NCCL_GRAPH_MIXING_SUPPORT=0
cd $OUT && tar -czf f.tgz f
