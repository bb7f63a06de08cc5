#!/usr/bin/env bash
# GPU call I (session 2026-11-28 b): the committed code (128-wide MN-major + 160-wide
# K-major wgmma conv, fitted plan, the K-major filter in two tiled passes). GPU test (SD);
# conv layer table (ours + cuDNN); SD steps new / prev (5835a2e) alternating, twice each.
set -u
B=.device-bin; O=$OUT/i; mkdir -p $O/sd $O/sd-prev $O/sd2 $O/sd-prev2 $O/conv
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=$(mktemp -d); [ -e /usr/local/cuda/lib64/libcublas.so ] || ln -s $(ls /usr/local/cuda/lib64/libcublas.so.[0-9]* | head -1) $L/libcublas.so; export LD_LIBRARY_PATH=$L:$LD_LIBRARY_PATH
T0=$(date +%s)
left() { echo $(( 440 - ($(date +%s)-T0) )); }
lim() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv > $O/clocks-start.txt
for t in $B/test-candle-rocm-stable_diffusion; do timeout $(lim 100) $t --test-threads=1 > $O/$(basename $t).log 2>&1; echo "$(basename $t) rc=$? t=$(( $(date +%s)-T0 )) $(grep 'test result' $O/$(basename $t).log | tail -1)" >> $O/summary.txt; done
timeout $(lim 90) $B/bench-conv --out $O/conv > $O/conv/bench-conv.log 2>&1; echo "bench-conv rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 60) python3 $B/python/torch_conv.py --out $O/conv > $O/conv/torch-conv.log 2>&1; echo "torch-conv rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
python3 $B/python/report_conv.py $O/conv > $O/conv/report.log 2>&1
ours() { # shape binary tag dir
  timeout $(lim 60) $B/$2 bench --shape $1 --steps 5 --device cuda:0 --dtype f16 > $O/$1-$3.log 2>&1
  echo "$3 $1 rc=$? t=$(( $(date +%s)-T0 )) $(grep -o '"median_ms":[0-9.]*' $O/$1-$3.log | tr '\n' ' ')" >> $O/summary.txt
  grep '^{' $O/$1-$3.log > $O/$4/ours_${1}_f16.jsonl || true
}
for s in sd15 sdxl; do
  ours $s sd-worker new sd
  ours $s sd-worker-prev prev sd-prev
  ours $s sd-worker new2 sd2
  ours $s sd-worker-prev prev2 sd-prev2
done
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv > $O/clocks-end.txt
cat $O/summary.txt
head -40 $O/conv/report_conv.md | cut -c1-400
cd $OUT && tar -czf callI.tgz i && rm -rf i
