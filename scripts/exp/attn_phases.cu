// Harness: where a block of the tensor-core split attention spends its time, phase by phase
// (TC_MARK in kernels/attention_tc.cu: start, after the PDL wait, Q staged, first tile in shared
// memory, its S, its softmax, the last P·V, end), for one cold launch at one context length with
// the engine's slicing. Prints, per mark, the median and the last block's time since the first
// block started. With Q1=1 the same for the one-row decode kernel (Q1_MARK in attention.cu:
// the first tile's scores and softmax, the last tile's P·V). Usage: [Q1=1] /tmp/attn_phases CTX [SPLITS]
// nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/attn_phases.cu -o /tmp/attn_phases
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
__device__ unsigned long long* g_trace;
__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
#define TC_MARK(i) \
    if (threadIdx.x == 0) g_trace[(blockIdx.y * gridDim.x + blockIdx.x) * 8 + (i)] = gtime();
#define Q1_MARK(i, dep)                                                                 \
    if (threadIdx.x == 0) {                                                             \
        asm volatile("" ::"f"(dep));                                                    \
        g_trace[(blockIdx.y * gridDim.x + blockIdx.x) * 8 + (i)] = gtime();             \
    }
#include "attention.cu"
#include "attention_tc.cu"

__global__ void scrub(float* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += 1.f;
}

int main(int argc, char** argv) {
    const int ctx = argc > 1 ? atoi(argv[1]) : 512;
    const bool q1 = getenv("Q1") != nullptr;
    const int nh = 32, nkv = 8, hd = 128, rows = q1 ? 1 : 8;
    const int first_pos = ctx, kv_len = ctx + rows;
    int kv_cap = 1;
    while (kv_cap < kv_len) kv_cap *= 2;
    const int keys = 32;
    const int splits = argc > 2 ? atoi(argv[2]) : std::min(q1 ? 66 : 33, kv_cap / keys);  // split_plan, 132 SMs
    const size_t cache = (size_t)kv_cap * nkv * hd;
    std::vector<float> h(cache);
    for (size_t i = 0; i < cache; i++) h[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
    float *k, *v, *q, *po, *pml, *sb;
    int* lens;
    cudaMalloc(&k, cache * 4); cudaMalloc(&v, cache * 4);
    cudaMemcpy(k, h.data(), cache * 4, cudaMemcpyHostToDevice); cudaMemcpy(v, h.data(), cache * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&q, rows * nh * hd * 4); cudaMemcpy(q, h.data(), rows * nh * hd * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&po, (size_t)128 * rows * nh * hd * 4); cudaMalloc(&pml, 128 * rows * nh * 2 * 4);
    int hl[2] = {first_pos, kv_len};
    cudaMalloc(&lens, 8); cudaMemcpy(lens, hl, 8, cudaMemcpyHostToDevice);
    const size_t scrub_n = 256ull << 20;
    cudaMalloc(&sb, scrub_n * 4);
    const int blocks = nkv * splits;
    unsigned long long* tr;
    cudaMalloc(&tr, blocks * 8 * 8);
    cudaMemcpyToSymbol(g_trace, &tr, sizeof(tr));
    const int smem = TC_SMEM(128);
    cudaFuncSetAttribute(attention_tc_hd128_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const char* tc_names[8] = {"start", "pdl wait", "Q staged", "tile in smem", "S", "softmax", "last P.V", "end"};
    const char* q1_names[8] = {"start", "pdl wait", "q staged", "tile in smem", "scores", "softmax", "last P.V", "end"};
    const char** names = q1 ? q1_names : tc_names;
    for (int rep = 0; rep < 3; rep++) {
        cudaMemset(tr, 0, blocks * 8 * 8);
        scrub<<<528, 512>>>(sb, scrub_n);  // nothing of K/V left in L2
        if (q1)
            attention_split_q1_hd128_f32<<<dim3(nkv, splits), 128>>>(q, k, v, po, pml, rows, nh, nkv, lens, 1, keys);
        else
            attention_tc_hd128_f32<<<dim3(nkv, splits), 256, smem>>>(q, k, v, po, pml, rows, nh, nkv, lens, 1, keys);
        cudaDeviceSynchronize();
        std::vector<unsigned long long> t(blocks * 8);
        cudaMemcpy(t.data(), tr, t.size() * 8, cudaMemcpyDeviceToHost);
        unsigned long long t0 = ~0ull;
        for (int b = 0; b < blocks; b++)
            if (t[b * 8]) t0 = std::min(t0, t[b * 8]);
        printf("ctx %d, grid %dx%d, cold launch %d (%s):", ctx, nkv, splits, rep, cudaGetErrorString(cudaGetLastError()));
        for (int i = 0; i < 8; i++) {
            std::vector<double> d;
            for (int b = 0; b < blocks; b++)
                if (t[b * 8 + i]) d.push_back((t[b * 8 + i] - t0) / 1e3);
            std::sort(d.begin(), d.end());
            if (d.empty()) continue;
            printf("  %s %.2f/%.2f", names[i], d[d.size() / 2], d.back());
        }
        int active = 0;
        for (int b = 0; b < blocks; b++) active += t[b * 8 + 7] != 0;
        printf("  (us: median/last block; %d blocks active)\n", active);
    }
}
