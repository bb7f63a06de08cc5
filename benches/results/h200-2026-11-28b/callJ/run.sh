#!/usr/bin/env bash
# GPU call J (session 2026-11-28 b): the committed conv layer table on an H100 (ours + cuDNN).
set -u
B=.device-bin; O=$OUT/j; mkdir -p $O/conv
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=$(mktemp -d); [ -e /usr/local/cuda/lib64/libcublas.so ] || ln -s $(ls /usr/local/cuda/lib64/libcublas.so.[0-9]* | head -1) $L/libcublas.so; export LD_LIBRARY_PATH=$L:$LD_LIBRARY_PATH
T0=$(date +%s)
timeout 110 $B/bench-conv --out $O/conv > $O/conv/bench-conv.log 2>&1; echo "bench-conv rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout 40 python3 $B/python/torch_conv.py --out $O/conv > $O/conv/torch-conv.log 2>&1; echo "torch-conv rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
python3 $B/python/report_conv.py $O/conv > $O/conv/report.log 2>&1
cat $O/gpu.txt $O/summary.txt
cd $OUT && tar -czf callJ.tgz j && rm -rf j
