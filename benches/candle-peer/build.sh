#!/usr/bin/env bash
# Builds the benchmark peer, Candle 0.11.1's own CUDA backend, on a machine without a GPU
# or a CUDA install, for the NVIDIA machine (which has the driver and the CUDA libraries
# but no Rust). Output: .device-bin/candle-peer (stripped x86-64 binary).
#
# - nvcc, its headers and the CUDA runtime come from PyPI, pinned to CUDA 13.0 so the PTX
#   that Candle's build embeds loads with the GPU machine's driver (CUDA 13.0, driver 580);
#   cuBLAS, cuRAND and NVRTC too (Candle links them).
# - libcuda (the driver) is not on PyPI: the link uses a stub with the driver's soname,
#   `libcuda.so.1`, leaves the driver's symbols undefined and adds `libcuda.so.1` to the
#   binary's needed libraries (patchelf): the real driver resolves them at start-up.
# - CUDA_COMPUTE_CAP=90: the H100.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
. "$ROOT/benches/cuda/nvcc-venv.sh"
# Candle also links cuBLAS, cuRAND and NVRTC.
if [ ! -f "$VENV/bin/candle-libs-ok" ]; then
    "$VENV/bin/pip" install -q "nvidia-cublas==13.0.*" "nvidia-curand==10.4.0.*" "nvidia-cuda-nvrtc==13.0.*"
    touch "$VENV/bin/candle-libs-ok"
fi
nvcc --version | tail -2

# A CUDA root as cudarc and Candle's kernel builder expect: bin/, include/, lib64/ with
# unversioned .so names for the linker.
CROOT="$CACHE/cuda-root"
rm -rf "$CROOT" && mkdir -p "$CROOT/lib64"
ln -s "$CU/bin" "$CROOT/bin"
ln -s "$CU/include" "$CROOT/include"
ln -s "$CU/nvvm" "$CROOT/nvvm"
for lib in cudart:13 cublas:13 cublasLt:13 curand:10 nvrtc:13; do
    name="${lib%%:*}" ver="${lib##*:}"
    real="$(ls "$CU/lib/lib$name.so.$ver"* 2>/dev/null | head -1)"
    [ -n "$real" ] || real="$(ls "$VENV"/lib/python3*/site-packages/nvidia/*/lib/lib$name.so.$ver* | head -1)"
    ln -s "$real" "$CROOT/lib64/lib$name.so"
done
echo 'void rocm_kernels_rs_libcuda_stub(void) {}' > "$CACHE/stub.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CROOT/lib64/libcuda.so" "$CACHE/stub.c"

export CUDA_PATH="$CROOT" CUDA_ROOT="$CROOT" CUDA_COMPUTE_CAP=90
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/candle-peer"
# Driver symbols stay undefined at link time (the stub has none) and bind at start-up.
export RUSTFLAGS="-C link-arg=-Wl,--unresolved-symbols=ignore-in-object-files -C link-arg=-L$CROOT/lib64"
cargo build --release --manifest-path "$HERE/Cargo.toml"
mkdir -p "$ROOT/.device-bin"
cp "$CARGO_TARGET_DIR/release/candle-peer" "$ROOT/.device-bin/candle-peer"
# The linker drops the stub (no symbol of it is used), so name the driver explicitly.
command -v patchelf >/dev/null || apt-get install -y -qq patchelf
patchelf --add-needed libcuda.so.1 "$ROOT/.device-bin/candle-peer"
echo "built $ROOT/.device-bin/candle-peer"
