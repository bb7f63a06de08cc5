#!/usr/bin/env bash
# Builds the read-bandwidth ceiling probe (benches/cuda/read_ceiling.cu) on a machine
# without a GPU, for the NVIDIA machine. Output: .device-bin/read-ceiling (x86-64, CUDA
# runtime linked statically, SASS for sm_90).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
. "$HERE/nvcc-venv.sh"
mkdir -p "$ROOT/.device-bin"
nvcc -O3 -std=c++20 -gencode arch=compute_90,code=sm_90 -I"$CU/include" -L"$CU/lib" -cudart static \
    "$HERE/read_ceiling.cu" -o "$ROOT/.device-bin/read-ceiling"
strip "$ROOT/.device-bin/read-ceiling"
echo "built $ROOT/.device-bin/read-ceiling"
