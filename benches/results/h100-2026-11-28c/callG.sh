#!/usr/bin/env bash
# GPU call G (session c): the SD steps (f16, random weights) with the attention on the wgmma
# prefill kernel (default on sm_90) and on the fragment kernel (ATTN_PREFILL_WGMMA=0),
# alternating in one call: SD 1.5's hd40 heads (padded to 64) and SDXL's hd64 heads take the
# wgmma kernel; SD 1.5's hd80 and hd160 heads do not.
set -u
B=.device-bin; O=$OUT/g; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
T0=$(date +%s)
left() { echo $(( 570 - ($(date +%s)-T0) )); }
lim() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
run() { # shape tag [env]
  local s=$1 tag=$2; shift 2
  env "$@" timeout $(lim 120) $B/sd-worker bench --shape $s --steps 5 --device cuda:0 --dtype f16 > $O/$s-$tag.log 2>&1
  echo "$s $tag rc=$? t=$(( $(date +%s)-T0 )) $(grep -o '"median_ms":[0-9.]*' $O/$s-$tag.log | tr '\n' ' ')" >> $O/summary.txt
}
for s in sd15 sdxl; do
  run $s wgmma ATTN_PREFILL_WGMMA=1
  run $s fragments ATTN_PREFILL_WGMMA=0
  run $s wgmma2 ATTN_PREFILL_WGMMA=1
  run $s fragments2 ATTN_PREFILL_WGMMA=0
done
cat $O/summary.txt
cd $OUT && tar -czf g.tgz g && rm -rf g
