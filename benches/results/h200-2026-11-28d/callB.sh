# Session d call B: mixed-step graphs (issue 31): llm-worker serve on the
# 1B bf16 model at 24 and 40 req/s and saturation (96 requests, prompt 512, 256 tokens) in several
# configurations, then the offline engine at 48 sequences.
set -u
O=$OUT/b; mkdir -p $O
B=$PWD/.device-bin
nvidia-smi > $O/gpu.txt 2>&1
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $O/summary.txt; }
M=/tmp/llama1b_bf16
timeout 120 $B/llm-worker write-random --family llama --shape 1b --dtype bf16 --out $M > $O/write.log 2>&1
el "written"
port=18080
run_cfg() { # run_cfg TAG ENV... -- ARGS...
  local tag=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" $B/llm-worker serve --model $M --device cuda:0 --port $port --served-model-name served --max-num-seqs 64 "$@" > $O/server_$tag.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; sleep 0.5; done
  el "$tag ready"
  for r in 24 40 inf; do
    seed=$(echo "rate-$r" | cksum | cut -d' ' -f1)
    timeout 120 $B/serve-load --url http://127.0.0.1:$port --model served --rates $r --seed $seed --requests ${REQS:-96} --prompt-len 512 --max-tokens 256 --vocab 128000 >> $O/load_$tag.log 2>&1
    curl -s http://127.0.0.1:$port/metrics > $O/metrics_${tag}_$r.txt
  done
  kill -TERM $pid; wait $pid; el "$tag shutdown rc=$?"
  grep '^{' $O/load_$tag.log | python3 -c '
import sys,json
for l in sys.stdin:
  j=json.loads(l); print(sys.argv[1], j["rate_req_s"], "ok", j["ok"], "req/s %.1f out tok/s %.0f ttft p50 %.1f p99 %.1f itl p50 %.3f p99 %.3f ratio %.2f" % (j["req_s"], j["output_tok_s"], j["ttft_ms_p50"], j["ttft_ms_p99"], j["itl_ms_p50"], j["itl_ms_p99"], j["itl_ms_p99"]/j["itl_ms_p50"]), j["errors"][:2])' $tag | tee -a $O/summary.txt
}
run_cfg uncapped X=1 --
run_cfg cap256w4 X=1 -- --prefill-chunk-while-decoding 256 --prefill-cap-backlog 4
run_cfg cap128w4 X=1 -- --prefill-chunk-while-decoding 128 --prefill-cap-backlog 4
run_cfg cap256w4_b X=1 -- --prefill-chunk-while-decoding 256 --prefill-cap-backlog 4
run_cfg uncapped_b X=1 --
timeout 150 $B/llm-worker bench --model $M --device cuda:0 --prompt-len 512 --gen 256 --concurrency 48,96 > $O/offline.log 2>&1
el "offline: $(grep '^{' $O/offline.log | tail -2)"
cd $OUT && tar -czf b.tgz b
