#!/usr/bin/env bash
# Builds the mma.sync GEMM peer, CUTLASS 2.x Sm80 tensor-op kernels
# (benches/cuda/cutlass_sm80_gemm.cu), on a machine without a GPU, for the NVIDIA machine.
# Output: .device-bin/cutlass-sm80-gemm (x86-64, CUDA runtime linked statically).
# - CUTLASS's headers come from PyPI's nvidia-cutlass wheel (pinned; the headers only, no
#   copy of them is kept in this repository).
# - nvcc comes from the PyPI venv of benches/cuda/nvcc-venv.sh (shared with the Candle
#   peer; CUDA 13.0 to match the GPU machine's driver).
# - SASS for sm_90 (the H100) from compute_90: the Sm80 kernels use mma.sync, ldmatrix and
#   cp.async only, as kernels::gemm does on NVIDIA.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
. "$HERE/nvcc-venv.sh"
CUTLASS="$CACHE/cutlass-4.2.0.0"
if [ ! -d "$CUTLASS/cutlass_library/source/include/cutlass" ]; then
    rm -rf "$CUTLASS" && mkdir -p "$CUTLASS"
    "$VENV/bin/pip" download -q --no-deps "nvidia-cutlass==4.2.0.0" -d "$CUTLASS"
    (cd "$CUTLASS" && python3 -m zipfile -e nvidia_cutlass-4.2.0.0-*.whl .)
fi
mkdir -p "$ROOT/.device-bin"
nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I"$CUTLASS/cutlass_library/source/include" \
    -I"$CU/include" -L"$CU/lib" -cudart static -w "$HERE/cutlass_sm80_gemm.cu" -o "$ROOT/.device-bin/cutlass-sm80-gemm"
strip "$ROOT/.device-bin/cutlass-sm80-gemm"
echo "built $ROOT/.device-bin/cutlass-sm80-gemm"
