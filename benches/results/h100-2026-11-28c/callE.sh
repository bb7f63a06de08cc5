#!/usr/bin/env bash
# GPU call E (session c): wgmma prefill with the causal mask as per-row key ranges (MASK
# mode). ptxas; flash GPU test; prefill bench (both kernels) + SDPA; ncu.
set -u
B=.device-bin; O=$OUT/e; mkdir -p $O/attention $O/ncu
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
T0=$(date +%s)
left() { echo $(( 570 - ($(date +%s)-T0) )); }
lim() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
ptxas -arch=sm_90a -v $B/ptx/attention.sm_90a.ptx -o /tmp/a.cubin > $O/ptxas.txt 2>&1; echo "ptxas rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 200) $B/test-attention-flash --test-threads=1 > $O/test-flash.log 2>&1; echo "test-flash rc=$? t=$(( $(date +%s)-T0 )) $(grep 'test result' $O/test-flash.log | tail -1)" >> $O/summary.txt
timeout $(lim 200) $B/bench-attention --only prefill --out $O/attention > $O/attention/bench.log 2>&1; echo "bench rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 150) python3 $B/python/torch_attention.py --only prefill --out $O/attention > $O/attention/torch.log 2>&1; echo "torch rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
python3 $B/python/report_attention.py $O/attention > $O/attention/report.log 2>&1
timeout $(lim 90) ncu --set full -k regex:flash_fwd_wgmma --launch-count 1 -o $O/ncu/wgmma_s8192_hd128 $B/bench-attention --prefill 1,16,8192,128,0 > $O/ncu/ncu.log 2>&1; echo "ncu prefill rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
ncu --import $O/ncu/wgmma_s8192_hd128.ncu-rep --page details > $O/ncu/wgmma_details.txt 2>&1
ncu --import $O/ncu/wgmma_s8192_hd128.ncu-rep --page raw --csv > $O/ncu/wgmma_raw.csv 2>&1
rm -f $O/ncu/*.ncu-rep
cat $O/summary.txt
cd $OUT && tar -czf e.tgz e && rm -rf e
