#!/usr/bin/env bash
# GPU call A (session c, 2026-11-28): the wgmma flash-attention prefill kernel.
# ptxas report; attention flash GPU test (both kernels); prefill bench (wgmma and fragment
# kernels in one run) + PyTorch SDPA flash/cuDNN; ncu of one wgmma launch.
set -u
B=.device-bin; O=$OUT/a; mkdir -p $O/attention $O/ncu
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
T0=$(date +%s)
left() { echo $(( 585 - ($(date +%s)-T0) )); }
lim() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
ptxas -arch=sm_90a -v $B/ptx/attention.sm_90a.ptx -o /tmp/a.cubin > $O/ptxas.txt 2>&1; echo "ptxas rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 200) $B/test-attention-flash --test-threads=1 > $O/test-flash.log 2>&1; echo "test-flash rc=$? t=$(( $(date +%s)-T0 )) $(grep 'test result' $O/test-flash.log | tail -1)" >> $O/summary.txt
timeout $(lim 150) $B/bench-attention --only prefill --out $O/attention > $O/attention/bench.log 2>&1; echo "bench rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 120) python3 $B/python/torch_attention.py --only prefill --out $O/attention > $O/attention/torch.log 2>&1; echo "torch rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
python3 $B/python/report_attention.py $O/attention > $O/attention/report.log 2>&1
timeout $(lim 120) ncu --set full -k regex:flash_fwd_wgmma --launch-count 1 -o $O/ncu/wgmma_s8192_hd128 $B/bench-attention --prefill 1,16,8192,128,0 > $O/ncu/ncu.log 2>&1; echo "ncu rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
ncu --import $O/ncu/wgmma_s8192_hd128.ncu-rep --page details > $O/ncu/wgmma_details.txt 2>&1
cat $O/summary.txt
