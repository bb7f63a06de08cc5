#!/usr/bin/env bash
# GPU call F (session c): every attention GPU test binary (flash, paged, prefill, cache) and
# candle-rocm's attention test on the committed kernels; decode bench + SDPA gathered again.
set -u
B=.device-bin; O=$OUT/f; mkdir -p $O/attention
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
T0=$(date +%s)
left() { echo $(( 570 - ($(date +%s)-T0) )); }
lim() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
export CANDLE_ROCM_GPU_ONLY=1
for t in $B/test-attention-flash $B/test-attention-paged $B/test-attention-prefill $B/test-attention-cache $B/test-candle-rocm-attention; do
  timeout $(lim 150) $t --test-threads=1 > $O/$(basename $t).log 2>&1; echo "$(basename $t) rc=$? t=$(( $(date +%s)-T0 )) $(grep 'test result' $O/$(basename $t).log | tail -1)" >> $O/summary.txt
done
timeout $(lim 150) $B/bench-attention --only decode --out $O/attention > $O/attention/bench.log 2>&1; echo "bench rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 120) python3 $B/python/torch_attention.py --only decode --out $O/attention > $O/attention/torch.log 2>&1; echo "torch rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
python3 $B/python/report_attention.py $O/attention > $O/attention/report.log 2>&1
cat $O/summary.txt
cd $OUT && tar -czf f.tgz f && rm -rf f
