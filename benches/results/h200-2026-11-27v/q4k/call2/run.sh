#!/bin/bash
# Q4_K/Q6_K decode matvec: main's bench binary against two builds of branch q4k, one call, same card.
set -u
P=$(cd "$(dirname "$0")" && pwd)
R="$OUT/q4k"; mkdir -p "$R/main" "$R/new1" "$R/new2" "$R/main-again"
cd "$P"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv > "$R/gpu.txt" 2>&1
t0=$(date +%s)
step() { local name=$1 lim=$2; shift 2; local s=$(date +%s); timeout "$lim" "$@" > "$R/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s ))s" >> "$R/steps.txt"; }
step main-decode 60 ./bench-quantized-main --decode q4_K q6_K --out "$R/main"
step new1-decode 60 ./bench-quantized-new1 --decode q4_K q6_K --out "$R/new1"
step new2-decode 60 ./bench-quantized-new2 --decode q4_K q6_K --out "$R/new2"
step main-decode-again 60 ./bench-quantized-main --decode q4_K --out "$R/main-again"
step new1-sweep-stages 40 ./bench-quantized-new1 --sweep-stages q4_K
step new2-sweep-stages 40 ./bench-quantized-new2 --sweep-stages q4_K q6_K
echo "total $(( $(date +%s) - t0 ))s" >> "$R/steps.txt"
cd "$OUT" && tar -czf q4k-results.tar.gz q4k
