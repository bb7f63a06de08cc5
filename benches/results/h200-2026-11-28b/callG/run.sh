#!/usr/bin/env bash
# GPU call G (session 2026-11-28 b): the 160-wide tiles in their own entry
# (conv2d_nhwc_wgmma_n160). GPU test; ptxas registers of both entries; conv layer table
# (ours: auto, n128, n160, each unsplit too, tiled; cuDNN); SD steps new / prev / new.
set -u
B=.device-bin; O=$OUT/g; mkdir -p $O/sd $O/sd-prev $O/conv
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $O/gpu.txt
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=$(mktemp -d); [ -e /usr/local/cuda/lib64/libcublas.so ] || ln -s $(ls /usr/local/cuda/lib64/libcublas.so.[0-9]* | head -1) $L/libcublas.so; export LD_LIBRARY_PATH=$L:$LD_LIBRARY_PATH
T0=$(date +%s)
left() { echo $(( 585 - ($(date +%s)-T0) )); }
lim() { local l=$(left); echo $(( l < $1 ? l : $1 )); }
for t in $B/test-kernels-conv_nhwc; do timeout $(lim 150) $t --test-threads=1 > $O/$(basename $t).log 2>&1; echo "$(basename $t) rc=$? t=$(( $(date +%s)-T0 )) $(grep 'test result' $O/$(basename $t).log | tail -1)" >> $O/summary.txt; done
PTXAS=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null)
$PTXAS -arch=sm_90a -v $B/ptx/kernels.sm_90a.variant.ptx -o /tmp/v.cubin > $O/ptxas.log 2>&1; echo "ptxas rc=$?" >> $O/summary.txt
grep -A4 "function 'conv2d_nhwc_wgmma" $O/ptxas.log | grep -E "entry|Used|spill" >> $O/summary.txt
timeout $(lim 120) $B/bench-conv --out $O/conv > $O/conv/bench-conv.log 2>&1; echo "bench-conv rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
timeout $(lim 60) python3 $B/python/torch_conv.py --out $O/conv > $O/conv/torch-conv.log 2>&1; echo "torch-conv rc=$? t=$(( $(date +%s)-T0 ))" >> $O/summary.txt
python3 $B/python/report_conv.py $O/conv > $O/conv/report.log 2>&1
ours() { # shape binary tag
  timeout $(lim 90) $B/$2 bench --shape $1 --steps 5 --device cuda:0 --dtype f16 > $O/$1-$3.log 2>&1
  echo "$3 $1 rc=$? t=$(( $(date +%s)-T0 )) $(grep -o '"median_ms":[0-9.]*' $O/$1-$3.log | tr '\n' ' ')" >> $O/summary.txt
}
for s in sd15 sdxl; do
  ours $s sd-worker new
  ours $s sd-worker-prev prev
  ours $s sd-worker new2
  grep '^{' $O/$s-new.log > $O/sd/ours_${s}_f16.jsonl || true
  grep '^{' $O/$s-prev.log > $O/sd-prev/ours_${s}_f16.jsonl || true
done
cat $O/summary.txt
python3 - $O/conv/rust_conv.json <<'PY'
import json,sys
rows=json.load(open(sys.argv[1])) if open(sys.argv[1]).read(1)=='[' else [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by={}
for r in rows: by.setdefault(r["layer"],{})[r["op"]]=r["us"]
ops=["conv_nhwc","conv_nhwc_n128","conv_nhwc_n160","conv_nhwc_n128_nosplit","conv_nhwc_n160_nosplit","conv_nhwc_tiled"]
print("layer | "+" | ".join(ops))
for l,d in by.items(): print(l+" | "+" | ".join(f"{d.get(o,0):.1f}" for o in ops))
PY
cd $OUT && tar -czf callG.tgz g && rm -rf g
