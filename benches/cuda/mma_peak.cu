// Peak throughput of mma.sync.m16n8k16 bf16 (f32 accumulate) on this GPU: the ceiling of
// kernels::gemm on NVIDIA. Each warp runs 16 independent accumulators, no memory traffic;
// prints TFLOP/s for 4, 8 and 16 warps per block (2 blocks per SM).
// Build and run on the GPU machine: nvcc -O3 -arch=sm_90 mma_peak.cu -o mma_peak && ./mma_peak
#include <cstdio>
#include <cuda_runtime.h>
template <int ILP>
__global__ void peak(float *out, int iters) {
  unsigned a0 = threadIdx.x * 0x3f803f80u, a1 = a0 ^ 1, a2 = a0 ^ 2, a3 = a0 ^ 3, b0 = a0 ^ 5, b1 = a0 ^ 7;
  float d[ILP][4] = {};
  for (int i = 0; i < iters; i++) {
#pragma unroll
    for (int j = 0; j < ILP; j++) {
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  float s = 0;
  for (int j = 0; j < ILP; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float *out; cudaMalloc(&out, 1 << 26);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  int iters = 4096;
  for (int warps : {4, 8, 16}) {
    int blocks = sms * 2;
    for (int rep = 0; rep < 2; rep++) {
      cudaEventRecord(e0);
      peak<16><<<blocks, warps * 32>>>(out, iters);
      cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      double flops = 2.0 * 16 * 8 * 16 * 16.0 * iters * warps * blocks;
      if (rep) printf("mma.sync bf16 m16n8k16: %2d warps/block x %d blocks (%d warps/SM): %.1f TFLOP/s\n", warps, blocks, 2 * warps, flops / ms / 1e9);
    }
  }
  return 0;
}
