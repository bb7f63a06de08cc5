#!/usr/bin/env bash
# GPU call B (session c): paged decode bench + SDPA gathered peer (H100); ncu of the decode
# at batch 16 ctx 4096; the wgmma prefill ncu details (call A's report was not returned).
set -u
B=.device-bin; O=$OUT/b; mkdir -p $O/attention $O/ncu
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
T0=$(date +%s)
left() { echo $(( 570 - ($(date +%s)-T0) )); }
lim() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
timeout $(lim 200) $B/bench-attention --only decode --out $O/attention > $O/attention/bench.log 2>&1; echo "bench rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 150) python3 $B/python/torch_attention.py --only decode --out $O/attention > $O/attention/torch.log 2>&1; echo "torch rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
python3 $B/python/report_attention.py $O/attention > $O/attention/report.log 2>&1
timeout $(lim 90) ncu --set full -k regex:paged --launch-count 4 -o $O/ncu/decode_b16_4k $B/bench-attention --decode 16,4096 > $O/ncu/ncu-decode.log 2>&1; echo "ncu decode rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
ncu --import $O/ncu/decode_b16_4k.ncu-rep --page details > $O/ncu/decode_details.txt 2>&1
timeout $(lim 90) ncu --set full -k regex:flash_fwd_wgmma --launch-count 1 -o $O/ncu/wgmma_s8192_hd128 $B/bench-attention --prefill 1,16,8192,128,0 > $O/ncu/ncu.log 2>&1; echo "ncu prefill rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
ncu --import $O/ncu/wgmma_s8192_hd128.ncu-rep --page details > $O/ncu/wgmma_details.txt 2>&1
ncu --import $O/ncu/wgmma_s8192_hd128.ncu-rep --page source --csv --print-source sass > $O/ncu/wgmma_sass.csv 2>/dev/null
rm -f $O/ncu/*.ncu-rep
cat $O/summary.txt
cd $OUT && tar -czf b.tgz b && rm -rf b
