# Session d call G (one H200): issue 31 with the committed defaults (f10e94d: prompt cap 128,
# backlog 4, mixed graphs). The official openai client streams a chat completion from the
# 1B server; then the 8B-shaped bf16 model served at 15 req/s (about half of its
# saturation) and saturation (48 requests, prompt 512, 256 tokens), default against no cap
# (--prefill-chunk-while-decoding 0), and the offline engine at 48 sequences.
set -u
O=$OUT/g; mkdir -p $O
B=$PWD/.device-bin
nvidia-smi > $O/gpu.txt 2>&1
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $O/summary.txt; }
M8=/tmp/llama8b_bf16
(timeout 240 $B/llm-worker write-random --family llama --shape 8b --dtype bf16 --out $M8 > $O/write8.log 2>&1; echo "write rc=$?" >> $O/write8.log) &
wpid=$!
M1=/tmp/llama1b_bf16
timeout 120 $B/llm-worker write-random --family llama --shape 1b --dtype bf16 --out $M1 > $O/write1.log 2>&1
port=18080
up() { # up TAG MODEL ARGS...
  local tag=$1 m=$2; shift 2
  $B/llm-worker serve --model $m --device cuda:0 --port $port --served-model-name served --max-num-seqs 64 "$@" > $O/server_$tag.log 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1 && break; sleep 0.5; done
  el "$tag ready"
}
down() { kill -TERM $pid; wait $pid; el "$1 shutdown rc=$?"; }
site=/tmp/py-openai
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --root-user-action=ignore --target $site $B/wheels/openai/*.whl > $O/pip.log 2>&1
up openai1b $M1
PYTHONPATH=$site timeout 120 python3 benches/python/openai_stream.py --base-url http://127.0.0.1:$port/v1 --max-tokens 64 --out $O > $O/openai_stream.log 2>&1
el "openai stream rc=$?: $(tail -3 $O/openai_stream.log | tr '\n' ' ')"
down openai1b
wait $wpid; el "$(tail -1 $O/write8.log)"
load() { # load TAG RATES
  local tag=$1 r i=0
  for r in $2; do
    i=$((i+1)); seed=$(echo "rate-$r-$i" | cksum | cut -d' ' -f1)
    timeout 150 $B/serve-load --url http://127.0.0.1:$port --model served --rates $r --seed $seed --requests 48 --prompt-len 512 --max-tokens 256 --vocab 128000 >> $O/load_$tag.log 2>&1
  done
  curl -s http://127.0.0.1:$port/metrics > $O/metrics_$tag.txt
  grep '^{' $O/load_$tag.log | python3 -c '
import sys,json
for l in sys.stdin:
  j=json.loads(l); print(sys.argv[1], j["rate_req_s"], "ok", j["ok"], "req/s %.1f out tok/s %.0f ttft p50 %.1f p99 %.1f itl p50 %.3f p99 %.3f ratio %.2f" % (j["req_s"], j["output_tok_s"], j["ttft_ms_p50"], j["ttft_ms_p99"], j["itl_ms_p50"], j["itl_ms_p99"], j["itl_ms_p99"]/j["itl_ms_p50"]), j["errors"][:2])' $tag | tee -a $O/summary.txt
}
up default8b $M8
load default8b "15 inf inf"
down default8b
up uncapped8b $M8 --prefill-chunk-while-decoding 0
load uncapped8b "15 inf"
down uncapped8b
timeout 150 $B/llm-worker bench --model $M8 --device cuda:0 --prompt-len 512 --gen 256 --concurrency 48,48 > $O/offline8b.log 2>&1
el "offline: $(grep '^{' $O/offline8b.log | python3 -c '
import sys,json
for l in sys.stdin:
  j=json.loads(l); print("c=%d output %.0f tok/s decode %.0f;" % (j["concurrency"], j["output_tok_s"], j["decode_tok_s"]), end=" ")')"
cd $OUT && tar -czf g.tgz g
