# Session d call D (two H200s): issue 33. NCCL all-reduce latency per call (PyTorch, eager
# and in a CUDA graph) at the decode shapes, with NCCL's default protocol choice and with
# NCCL_PROTO=LL; the TP GPU tests; the 8B bf16 TP=1 / TP=2 decode at batch 1 (and 64), TP=2
# again under NCCL_PROTO=LL.
set -u
O=$OUT/d; mkdir -p $O
B=$PWD/.device-bin
nvidia-smi > $O/gpu.txt 2>&1; nvidia-smi topo -m >> $O/gpu.txt 2>&1
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $O/summary.txt; }
M=/tmp/llama8b_bf16
(timeout 200 $B/llm-worker write-random --family llama --shape 8b --dtype bf16 --out $M > $O/write.log 2>&1; echo "write rc=$?" >> $O/write.log) &
wpid=$!
timeout 90 python3 .gpu-pack/nccl_graph.py 29511 > $O/nccl_default.jsonl 2> $O/nccl_default.err
el "nccl default: $(cat $O/nccl_default.jsonl | tr '\n' ' ')"
NCCL_PROTO=LL timeout 90 python3 .gpu-pack/nccl_graph.py 29512 > $O/nccl_ll.jsonl 2> $O/nccl_ll.err
el "nccl LL: $(cat $O/nccl_ll.jsonl | tr '\n' ' ')"
(timeout 150 $B/test-llm-tp_gpu --test-threads=1 > $O/test-tp-gpu.txt 2>&1; echo "rc=$?" >> $O/test-tp-gpu.txt)
el "tp_gpu: $(grep -E '^test result|SKIPPED' $O/test-tp-gpu.txt | tr '\n' ' ')"
wait $wpid; el "$(tail -1 $O/write.log)"
bench() { # bench TAG TP CONC ENV...
  local tag=$1 tp=$2 c=$3; shift 3
  env "$@" timeout 150 $B/llm-worker bench --model $M --device cuda:0 --tensor-parallel $tp --prompt-len 512 --gen 128 --concurrency $c > $O/bench_$tag.log 2>&1
  el "$tag: $(grep '^{' $O/bench_$tag.log | python3 -c '
import sys,json
for l in sys.stdin:
  j=json.loads(l); print("c=%d decode %.1f tok/s ttft %.1f ms;" % (j["concurrency"], j["decode_tok_s"], j["ttft_ms"]), end=" ")')"
}
bench tp1 1 1,64 X=1
bench tp2 2 1,64 X=1
bench tp2_ll 2 1 NCCL_PROTO=LL
bench tp1_b 1 1 X=1
bench tp2_b 2 1 X=1
cd $OUT && tar -czf d.tgz d
