#!/usr/bin/env bash
# GPU call H (session c): ncu of the wgmma prefill at hd64 (batch 4, 32 heads, seq 2048,
# non-causal: where it trails SDPA-flash) beside hd128 at the same shape, for the misses.
set -u
B=.device-bin; O=$OUT/h; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
for spec in "4,32,2048,64,0 hd64" "4,16,2048,128,0 hd128"; do
  set -- $spec
  timeout 120 ncu --set full -k regex:flash_fwd_wgmma --launch-count 1 -o $O/$2 $B/bench-attention --prefill $1 > $O/ncu-$2.log 2>&1; echo "ncu $2 rc=$?" >> $O/summary.txt
  ncu --import $O/$2.ncu-rep --page details > $O/ncu_prefill_wgmma_$2_s2048.txt 2>&1
  ncu --import $O/$2.ncu-rep --page raw --csv > $O/ncu_prefill_wgmma_$2_s2048_raw.csv 2>&1
  rm -f $O/$2.ncu-rep
done
cat $O/summary.txt
cd $OUT && tar -czf h.tgz h && rm -rf h
