// The mma.sync ceiling of a tuned library on this GPU: CUTLASS 2.x `device::Gemm` kernels for
// Sm80 tensor cores (mma.sync m16n8k16, ldmatrix, cp.async multistage), the instruction
// kernels::gemm uses on NVIDIA, bf16 in, f32 accumulate, bf16 out, A and B row-major (as the
// benchmark's torch.matmul and ours). Prints one JSON line per (config, shape) with TFLOP/s
// (median of 7 timed calls after 3 warm-ups). Built by benches/cuda/build-cutlass-peer.sh
// (headers from PyPI's nvidia-cutlass, nvcc from PyPI), run on the GPU machine.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm.h>
#include <cutlass/epilogue/thread/linear_combination.h>

using bf16 = cutlass::bfloat16_t;
using RowMajor = cutlass::layout::RowMajor;

template <int BM, int BN, int BK, int WM, int WN, int WK, int Stages>
using SmGemm = cutlass::gemm::device::Gemm<
    bf16, RowMajor, bf16, RowMajor, bf16, RowMajor, float,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<BM, BN, BK>, cutlass::gemm::GemmShape<WM, WN, WK>,
    cutlass::gemm::GemmShape<16, 8, 16>,
    cutlass::epilogue::thread::LinearCombination<bf16, 8, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, Stages>;

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename G>
static void bench(const char *name, int m, int n, int k, bf16 *a, bf16 *b, bf16 *c) {
  G gemm;
  typename G::Arguments args({m, n, k}, {a, k}, {b, n}, {c, n}, {c, n}, {1.0f, 0.0f});
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess) {
    printf("{\"config\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"error\": \"can_implement: %s\"}\n", name, m, n, k,
           cutlass::cutlassGetStatusString(st));
    return;
  }
  st = gemm.initialize(args, nullptr);
  if (st != cutlass::Status::kSuccess) {
    printf("{\"config\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"error\": \"initialize: %s\"}\n", name, m, n, k,
           cutlass::cutlassGetStatusString(st));
    return;
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 3; i++) gemm.run();
  std::vector<float> ms;
  for (int i = 0; i < 7; i++) {
    cudaEventRecord(e0);
    gemm.run();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  cudaError_t err = cudaGetLastError();
  float t = median(ms);
  double tflops = 2.0 * m * n * k / (t * 1e-3) / 1e12;
  printf("{\"config\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"us\": %.1f, \"tflops\": %.1f, \"cuda\": \"%s\"}\n", name, m, n,
         k, t * 1e3, tflops, cudaGetErrorString(err));
  fflush(stdout);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

__global__ void fill(bf16 *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    p[i] = bf16(((h & 0xffff) / 65536.0f - 0.5f));
  }
}

// Three device buffers of `elems` bf16 values; A and B filled with values in [-0.5, 0.5).
static void alloc_inputs(size_t elems, bf16 **a, bf16 **b, bf16 **c) {
  cudaMalloc(a, elems * 2);
  cudaMalloc(b, elems * 2);
  cudaMalloc(c, elems * 2);
  fill<<<1024, 256>>>(*a, elems, 1);
  fill<<<1024, 256>>>(*b, elems, 2);
  cudaDeviceSynchronize();
}

int main(int argc, char **argv) {
  // `cutlass-sm80-gemm M N K`: only the 128x256x64 3-stage kernel on that shape (for ncu).
  if (argc == 4) {
    int m = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]);
    bf16 *a, *b, *c;
    alloc_inputs(std::max({(size_t)m * k, (size_t)k * n, (size_t)m * n}), &a, &b, &c);
    bench<SmGemm<128, 256, 64, 64, 64, 64, 3>>("128x256x64_w64x64_s3", m, n, k, a, b, c);
    return 0;
  }
  const int shapes[][3] = {{8192, 8192, 8192}, {4096, 4096, 4096}, {4096, 4096, 14336}, {1024, 14336, 4096}};
  size_t most = 0;
  for (auto &s : shapes) most = std::max({most, (size_t)s[0] * s[2], (size_t)s[2] * s[1], (size_t)s[0] * s[1]});
  bf16 *a, *b, *c;
  alloc_inputs(most, &a, &b, &c);
  for (auto &s : shapes) {
    int m = s[0], n = s[1], k = s[2];
    bench<SmGemm<128, 256, 64, 64, 64, 64, 3>>("128x256x64_w64x64_s3", m, n, k, a, b, c);
    bench<SmGemm<256, 128, 64, 64, 64, 64, 3>>("256x128x64_w64x64_s3", m, n, k, a, b, c);
    bench<SmGemm<128, 256, 32, 64, 64, 32, 4>>("128x256x32_w64x64_s4", m, n, k, a, b, c);
    bench<SmGemm<256, 128, 32, 64, 64, 32, 4>>("256x128x32_w64x64_s4", m, n, k, a, b, c);
    bench<SmGemm<128, 128, 64, 64, 64, 64, 4>>("128x128x64_w64x64_s4", m, n, k, a, b, c);
    bench<SmGemm<128, 128, 32, 64, 64, 32, 5>>("128x128x32_w64x64_s5", m, n, k, a, b, c);
  }
  return 0;
}
