// Read-bandwidth ceiling of the H100 for the sizes of the quantized matvec's weights: how
// fast a kernel that does nothing but read N bytes from DRAM (and fold them into one word
// per work-group) can go, launched back to back as the matvec is, as % of the 1 GiB
// device-to-device copy rate that `bench-quantized` reports against. This is the bound the
// matvec's "% of copy" is measured under; it is not a peer and no kernel of the project.
//
// Built here by benches/cuda/build-read-ceiling.sh (PyPI nvcc), run on the GPU machine:
//   read-ceiling            # every size, grid and launch mode; one line each
// Each size cycles through copies of its buffer (256 MiB in all) so every call reads from
// DRAM, as bench-quantized's ColdSet does.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

// Grid-stride reads of 16-byte words, U independent loads per iteration in flight.
// `pdl`: release the next kernel at once and wait for the previous one only before the
// store (its reads do not depend on it), as the matvec does with programmatic launch.
template <int U, bool PDL>
__global__ void read_stride(const uint4* __restrict__ p, size_t n, unsigned* out) {
    if (PDL) asm volatile("griddepcontrol.launch_dependents;");
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) { uint4 v = __ldcs(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    // Keep the reads: one word per work-group, written only if it happens to be 1.
    acc = __reduce_xor_sync(0xffffffff, acc);
    if (acc == 1u && (threadIdx.x & 31) == 0) out[blockIdx.x] = acc;
}

struct Mode { const char* name; void (*k)(const uint4*, size_t, unsigned*); bool pdl; };

static float time_ms(cudaStream_t s, int iters, auto&& f) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) f();
    std::vector<float> reps;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < iters; i++) f();
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b));
        reps.push_back(ms / iters);
    }
    std::sort(reps.begin(), reps.end());
    return reps[2];
}

int main() {
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    size_t gib = 1ull << 30;
    char *src, *dst; CK(cudaMalloc(&src, gib)); CK(cudaMalloc(&dst, gib));
    CK(cudaMemset(src, 1, gib));
    float copy_ms = time_ms(s, 10, [&] { CK(cudaMemcpyAsync(dst, src, gib, cudaMemcpyDeviceToDevice, s)); });
    double copy_gbps = 2.0 * gib / (copy_ms * 1e-3) / 1e9;
    printf("copy 1 GiB: %.1f us, %.0f GB/s\n", copy_ms * 1e3, copy_gbps);
    CK(cudaFree(src)); CK(cudaFree(dst));
    unsigned* out; CK(cudaMalloc(&out, 1 << 20));
    Mode modes[] = {
        {"u4", read_stride<4, false>, false}, {"u8", read_stride<8, false>, false},
        {"u4+pdl", read_stride<4, true>, true}, {"u8+pdl", read_stride<8, true>, true},
    };
    // Weight bytes of the Llama-3-8B matvec shapes: q4_0 / q4_K 4096x14336, q6_K and
    // q8_0 of the same, q4_0 4096x4096, q4_0 128256x4096.
    struct Size { const char* name; size_t bytes; } sizes[] = {
        {"q4_0 4096x4096", 4096ull * 4096 / 32 * 18}, {"q4_0 4096x14336", 4096ull * 14336 / 32 * 18},
        {"q6_K 4096x14336", 4096ull * 14336 / 256 * 210}, {"q8_0 4096x14336", 4096ull * 14336 / 32 * 34},
        {"q4_0 128256x4096", 128256ull * 4096 / 32 * 18},
    };
    for (auto& sz : sizes) {
        size_t bytes = (sz.bytes + 255) & ~size_t(255);
        int copies = std::max<size_t>(1, (256ull << 20) / bytes);
        char* buf; CK(cudaMalloc(&buf, bytes * copies));
        CK(cudaMemset(buf, 3, bytes * copies));
        int iters = sz.bytes >= (64 << 20) ? 10 : 50;
        int next = 0;
        auto pct = [&](float ms) { return 100.0 * sz.bytes / (ms * 1e-3) / 1e9 / copy_gbps; };
        {
            char* d2; CK(cudaMalloc(&d2, bytes));
            float ms = time_ms(s, iters, [&] { CK(cudaMemcpyAsync(d2, buf + (size_t)(next++ % copies) * bytes, sz.bytes, cudaMemcpyDeviceToDevice, s)); });
            printf("%-18s copy (cold): %.2f us, %.1f%% of the 1 GiB copy rate\n", sz.name, ms * 1e3, 2 * pct(ms));
            CK(cudaFree(d2));
        }
        for (auto& m : modes) {
            printf("%-18s read %-7s", sz.name, m.name);
            for (int per_sm : {4, 8, 16}) {
                int blocks = sms * per_sm;
                float ms = time_ms(s, iters, [&] {
                    const uint4* p = (const uint4*)(buf + (size_t)(next++ % copies) * bytes);
                    size_t n = sz.bytes / 16;
                    cudaLaunchConfig_t cfg = {};
                    cfg.gridDim = dim3(blocks); cfg.blockDim = dim3(256); cfg.stream = s;
                    cudaLaunchAttribute at[1];
                    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    at[0].val.programmaticStreamSerializationAllowed = 1;
                    cfg.attrs = at; cfg.numAttrs = m.pdl ? 1 : 0;
                    CK(cudaLaunchKernelEx(&cfg, m.k, p, n, out));
                });
                printf(" %2d/SM %7.2f us (%5.1f%%)", per_sm, ms * 1e3, pct(ms));
            }
            printf("\n");
        }
        CK(cudaFree(buf));
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
