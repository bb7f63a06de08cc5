# Sourced by the peer build scripts (benches/candle-peer/build.sh,
# benches/cuda/build-cutlass-peer.sh): a Python venv with PyPI's nvcc, its headers and the
# CUDA runtime, pinned to CUDA 13.0 so the PTX and binaries built here run with the GPU
# machine's driver (CUDA 13.0, driver 580). Sets CACHE, VENV, CU and puts nvcc on PATH.
CACHE="${CANDLE_PEER_CACHE:-$HOME/.cache/rocm-kernels-rs/candle-peer}"
VENV="$CACHE/venv"
if [ ! -f "$VENV/bin/nvcc-ok" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
        "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*"
    touch "$VENV/bin/nvcc-ok"
fi
CU="$(ls -d "$VENV"/lib/python3*/site-packages/nvidia/cu13)"
export PATH="$CU/bin:$PATH"
