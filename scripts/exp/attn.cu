// Harness: the split attention kernels alone at one context length, back to back over rotating
// K/V copies (no L2 reuse), for timing and ncu. Usage: /tmp/attn {tc|q1} CTX [ITERS]
// nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/attn.cu -o /tmp/attn
// To compare with another revision, put its kernels/{attention,attention_tc}.cu and common.cuh
// in a folder (git show REV:kernels/FILE) and compile a second binary with -I that folder.
// KEYS=n overrides the keys per slice (the grid then covers kv_cap / n slices, at most 128);
// SPLITS=n sets the grid's slices instead (split_plan in ops.rs: KEYS=32 with SPLITS=66 for q1,
// 33 for tc is what the engine launches at 4096 keys on 132 SMs).
#include "attention.cu"
#include "attention_tc.cu"
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

int main(int argc, char** argv) {
    const bool tc = argc > 1 && argv[1][0] == 't';
    // "q8": the one-query-per-warp decode kernel over a verify's 8 rows (8 query groups per head).
    const bool q8 = argc > 1 && argv[1][0] == 'q' && argv[1][1] == '8';
    const int ctx = argc > 2 ? atoi(argv[2]) : 4096, iters = argc > 3 ? atoi(argv[3]) : 60;
    const int nh = 32, nkv = 8, hd = 128, rows = tc || q8 ? 8 : 1, COPIES = 6;
    const int first_pos = ctx, kv_len = ctx + rows;
    int kv_cap = 1; while (kv_cap < kv_len) kv_cap *= 2;
    const int keys = getenv("KEYS") ? atoi(getenv("KEYS")) : kv_cap <= 2048 ? 32 : tc ? 128 : 64;
    const int splits = getenv("SPLITS") ? atoi(getenv("SPLITS")) : std::min(128, (kv_cap + keys - 1) / keys);
    const size_t cache = (size_t)kv_cap * nkv * hd;
    std::vector<float> h(cache);
    for (size_t i = 0; i < cache; i++) h[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
    std::vector<float*> ks(COPIES), vs(COPIES);
    for (int c = 0; c < COPIES; c++) {
        cudaMalloc(&ks[c], cache * 4); cudaMalloc(&vs[c], cache * 4);
        cudaMemcpy(ks[c], h.data(), cache * 4, cudaMemcpyHostToDevice); cudaMemcpy(vs[c], h.data(), cache * 4, cudaMemcpyHostToDevice);
    }
    float *q, *po, *pml, *out; int* lens;
    cudaMalloc(&q, rows * nh * hd * 4); cudaMemcpy(q, h.data(), rows * nh * hd * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&po, (size_t)128 * rows * nh * hd * 4); cudaMalloc(&pml, 128 * rows * nh * 2 * 4); cudaMalloc(&out, rows * nh * hd * 4);
    int hl[2] = {first_pos, kv_len}; cudaMalloc(&lens, 8); cudaMemcpy(lens, hl, 8, cudaMemcpyHostToDevice);
    const int smem = TC_SMEM(128);
    cudaFuncSetAttribute(attention_tc_hd128_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    auto attn = [&](int c) {
        if (tc) attention_tc_hd128_f32<<<dim3(nkv, splits), 256, smem>>>(q, ks[c], vs[c], po, pml, rows, nh, nkv, lens, 1, keys);
        else attention_split_q1_hd128_f32<<<dim3(nkv * rows, splits), 128>>>(q, ks[c], vs[c], po, pml, rows, nh, nkv, lens, 1, keys);
    };
    auto comb = [&]() { attention_combine_f32<<<rows * nh, 4 * hd>>>(po, pml, out, rows, nh, hd, lens, keys, splits); };
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int i = 0; i < 5; i++) { attn(i % COPIES); comb(); }
    float ms1, ms2;
    cudaEventRecord(e0); for (int i = 0; i < iters; i++) attn(i % COPIES); cudaEventRecord(e1); cudaEventSynchronize(e1); cudaEventElapsedTime(&ms1, e0, e1);
    cudaEventRecord(e0); for (int i = 0; i < iters; i++) { attn(i % COPIES); comb(); } cudaEventRecord(e1); cudaEventSynchronize(e1); cudaEventElapsedTime(&ms2, e0, e1);
    std::vector<float> ho(rows * nh * hd); cudaMemcpy(ho.data(), out, ho.size() * 4, cudaMemcpyDeviceToHost);
    double cks = 0; for (float x : ho) cks += x;
    const double mb = 2.0 * kv_len * nkv * hd * 4 / 1e6;
    printf("%s ctx %d: grid %dx%d keys %d | attention %.2f us (%.0f GB/s of %.1f MB K+V) | +combine %.2f us | checksum %.6f | %s\n",
           tc ? "tc" : q8 ? "q8" : "q1", ctx, nkv, splits, keys, ms1 * 1000 / iters, mb * 1e3 / (ms1 * 1000 / iters), mb, ms2 * 1000 / iters, cks,
           cudaGetErrorString(cudaDeviceSynchronize()));
}
