// Experiment: can weights prefetched into L2 during a latency-bound phase make the next matvec
// read from L2? Times matvec_tc (kernels/matvec.cu) cold, after a plain warm-up read, and after
// a bulk L2 prefetch issued inside a spin kernel standing in for attention.
// nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/l2_prefetch.cu -o /tmp/l2p
#include "../../kernels/matvec.cu"
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

__global__ void scrub(float* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += 1.f;
}
// Spins ~ns nanoseconds per block; block 0.. issue bulk L2 prefetch of [w, w+bytes) in 64 KB pieces.
__global__ void spin_prefetch(const char* w, size_t bytes, long ns, int mode) {
    if (mode == 1) {
        size_t piece = 65536;
        size_t n = (bytes + piece - 1) / piece;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
            size_t off = i * piece, sz = piece < bytes - off ? piece : bytes - off;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + off), "r"((unsigned)sz) : "memory");
        }
    } else if (mode == 2) {
        for (size_t off = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 256; off < bytes; off += (size_t)gridDim.x * blockDim.x * 256)
            asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(w + off));
    }
    long t0 = clock64();
    // ~1.98 GHz: cycles
    while (clock64() - t0 < ns * 2) {}
}

int main() {
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    int l2; cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
    printf("sms %d l2 %d MB\n", sms, l2 >> 20);
    size_t scrub_n = 512ull << 20 >> 2;
    float* sb; cudaMalloc(&sb, scrub_n * 4);
    struct Shape { const char* name; int out, in, ks; const char* kern; int minb; };
    Shape shapes[] = {{"o 4096x4096", 4096, 4096, 8, "u4", 2}, {"qkv 6144x4096", 6144, 4096, 8, "u2", 3},
                      {"down 4096x12288", 4096, 12288, 8, "u4", 2}, {"k 1024x4096", 1024, 4096, 8, "u4b1", 1}};
    float *x, *y; cudaMalloc(&x, 8 * 12288 * 4); cudaMalloc(&y, 8 * 12288 * 4);
    cudaMemset(x, 0, 8 * 12288 * 4);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (auto& s : shapes) {
        size_t bytes = (size_t)s.out * s.in * 2;
        __nv_bfloat16* w; cudaMalloc(&w, bytes); cudaMemset(w, 0, bytes);
        int tiles = s.out / 16, blocks = tiles / (8 / s.ks);
        auto mv = [&](int m) {
            if (s.kern[1] == '2') matvec_tc_bf16<<<blocks, 256>>>(w, x, y, m, s.in, s.out, 0, s.ks, nullptr, 0, 0.f, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0);
            else if (s.kern[2] == 'b') matvec_tc_u4b1_bf16<<<blocks, 256>>>(w, x, y, m, s.in, s.out, 0, s.ks, nullptr, 0, 0.f, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0);
            else matvec_tc_u4_bf16<<<blocks, 256>>>(w, x, y, m, s.in, s.out, 0, s.ks, nullptr, 0, 0.f, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0);
        };
        for (int m : {1, 7}) {
            const char* cases[] = {"cold", "warm(read twice)", "spin10us", "spin10us+bulkpf", "spin10us+pf.evict_last", "spin20us+bulkpf"};
            for (int c = 0; c < 6; c++) {
                std::vector<float> ts;
                for (int rep = 0; rep < 15; rep++) {
                    scrub<<<4 * sms, 512>>>(sb, scrub_n);
                    if (c == 1) mv(m);
                    if (c >= 2) spin_prefetch<<<sms, 128>>>((const char*)w, bytes, c == 5 ? 20000 : 10000, c == 3 || c == 5 ? 1 : c == 4 ? 2 : 0);
                    cudaEventRecord(e0);
                    mv(m);
                    cudaEventRecord(e1);
                    cudaEventSynchronize(e1);
                    float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms * 1000);
                }
                std::sort(ts.begin(), ts.end());
                printf("%-16s m=%d %-24s median %.2f us  min %.2f  (floor %.2f us at 4.3 TB/s)\n", s.name, m, cases[c], ts[7], ts[0], bytes / 4.3e6);
            }
        }
        cudaFree(w);
    }
    cudaError_t err = cudaDeviceSynchronize();
    printf("status %s\n", cudaGetErrorString(err));
}
