#!/usr/bin/env bash
# GPU call F (session 2026-11-28 b): conv2d_nhwc_wgmma with 160-wide tiles and a K-major
# filter. GPU tests; ptxas registers of the new kernel; conv layer table (ours: auto,
# n128, n160, tiled; cuDNN); SD steps new / prev (5835a2e) / new, one process each; then
# new with the channels-last route everywhere (CANDLE_ROCM_CONV=nhwc); then diffusers per
# shape while time is left.
set -u
B=.device-bin; O=$OUT/f; mkdir -p $O/sd $O/sd-prev $O/sd-nhwc $O/conv
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=$(mktemp -d); [ -e /usr/local/cuda/lib64/libcublas.so ] || ln -s $(ls /usr/local/cuda/lib64/libcublas.so.[0-9]* | head -1) $L/libcublas.so; export LD_LIBRARY_PATH=$L:$LD_LIBRARY_PATH
T0=$(date +%s)
left() { echo $(( 585 - ($(date +%s)-T0) )); }
lim() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
for t in $B/test-kernels-conv_nhwc $B/test-candle-rocm-stable_diffusion; do timeout $(lim 150) $t --test-threads=1 > $O/$(basename $t).log 2>&1; echo "$(basename $t) rc=$? t=$(( $(date +%s)-T0 )) $(grep 'test result' $O/$(basename $t).log | tail -1)" >> $O/summary.txt; done
PTXAS=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null)
$PTXAS -arch=sm_90a -v $B/ptx/kernels.sm_90a.variant.ptx -o /tmp/v.cubin > $O/ptxas.log 2>&1; echo "ptxas rc=$?" >> $O/summary.txt
grep -A4 "function 'conv2d_nhwc_wgmma" $O/ptxas.log | grep -E "entry|Used|spill" >> $O/summary.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/py-diffusers $B/wheels/diffusers/*.whl > $O/pip.log 2>&1
timeout $(lim 90) $B/bench-conv --out $O/conv > $O/conv/bench-conv.log 2>&1; echo "bench-conv rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 60) python3 $B/python/torch_conv.py --out $O/conv > $O/conv/torch-conv.log 2>&1; echo "torch-conv rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
python3 $B/python/report_conv.py $O/conv > $O/conv/report.log 2>&1
ours() { # shape binary tag [conv route]
  if [ -n "${4:-}" ]; then export CANDLE_ROCM_CONV=$4; else unset CANDLE_ROCM_CONV; fi
  timeout $(lim 90) $B/$2 bench --shape $1 --steps 5 --device cuda:0 --dtype f16 > $O/$1-$3.log 2>&1
  echo "$3 $1 rc=$? t=$(( $(date +%s)-T0 )) $(grep -o '"median_ms":[0-9.]*' $O/$1-$3.log | tr '\n' ' ')" >> $O/summary.txt
  unset CANDLE_ROCM_CONV
}
for s in sd15 sdxl; do
  ours $s sd-worker new
  ours $s sd-worker-prev prev
  ours $s sd-worker new2
  ours $s sd-worker nhwc nhwc
  grep '^{' $O/$s-new.log > $O/sd/ours_${s}_f16.jsonl || true
  grep '^{' $O/$s-prev.log > $O/sd-prev/ours_${s}_f16.jsonl || true
  grep '^{' $O/$s-nhwc.log > $O/sd-nhwc/ours_${s}_f16.jsonl || true
done
for s in sd15 sdxl; do
  if [ $(left) -gt 80 ]; then
    mkdir -p $O/torch-$s
    PYTHONPATH=/tmp/py-diffusers timeout $(lim 100) python3 $B/python/torch_sd.py --out $O/torch-$s --shapes $s --steps 5 > $O/torch-$s.log 2>&1
    echo "torch $s rc=$? t=$(( $(date +%s)-T0 )) $(grep -o '"median_ms": [0-9.]*' $O/torch-$s/torch_sd.jsonl | tr '\n' ' ')" >> $O/summary.txt
  fi
done
cat $O/torch-*/torch_sd.jsonl > $O/sd/torch_sd.jsonl 2>/dev/null; for d in sd-prev sd-nhwc; do cp $O/sd/torch_sd.jsonl $O/$d/ 2>/dev/null; done
for d in sd sd-prev sd-nhwc; do python3 $B/python/report_sd.py $O/$d > $O/report-$d.log 2>&1; done
cat $O/summary.txt; for d in sd sd-prev sd-nhwc; do echo "== $d"; cat $O/$d/report_sd.csv; done
head -40 $O/conv/report_conv.md
cd $OUT && tar -czf callF.tgz f && rm -rf f
