// Harness: the decode attention with qkv_rope_append folded in (kernels/norm_rope.cuh) against
// the two launches it replaces, back to back over rotating K/V copies, in µs a call (CUDA
// events, plain stream order). Usage: /tmp/fold q1 CTX [ITERS]. (A tensor-core twin, `tc`, was
// measured in stop 21 and not kept: docs/perf.md.)
// nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/fold.cu -o /tmp/fold
#include "attention.cu"
#include "rope.cu"
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

int main(int argc, char** argv) {
    const int ctx = argc > 2 ? atoi(argv[2]) : 512, iters = argc > 3 ? atoi(argv[3]) : 200;
    const int nh = 32, nkv = 8, hd = 128, rows = 1, COPIES = 6, heads = nh + 2 * nkv;
    const int first_pos = ctx, kv_len = ctx + rows;
    int kv_cap = 1; while (kv_cap < kv_len + 64) kv_cap *= 2;
    const int keys = 32, per_sm = 4, blocks = nkv;
    const int splits = std::max(1, std::min(std::min(128, (kv_cap + 31) / 32), per_sm * 132 / blocks));
    const size_t cache = (size_t)kv_cap * nkv * hd;
    // Deterministic values in [-1, 1]; COPIES K and V caches, so no launch finds its cache in L2.
    std::vector<float> h(cache);
    for (size_t i = 0; i < cache; i++) h[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
    auto device_copy = [&]() {
        float* d;
        cudaMalloc(&d, cache * 4);
        cudaMemcpy(d, h.data(), cache * 4, cudaMemcpyHostToDevice);
        return d;
    };
    std::vector<float*> ks, vs;
    for (int c = 0; c < COPIES; c++) ks.push_back(device_copy()), vs.push_back(device_copy());
    float *qkv, *q, *po, *pml, *qn, *kn, *fr;
    int* lens;
    cudaMalloc(&qkv, rows * heads * hd * 4); cudaMemcpy(qkv, h.data(), rows * heads * hd * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&q, rows * nh * hd * 4);
    cudaMalloc(&qn, hd * 4); cudaMemcpy(qn, h.data() + 7, hd * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&kn, hd * 4); cudaMemcpy(kn, h.data() + 99, hd * 4, cudaMemcpyHostToDevice);
    std::vector<float> f(hd / 2); for (int i = 0; i < hd / 2; i++) f[i] = powf(1e6f, -2.f * i / hd);
    cudaMalloc(&fr, hd * 2); cudaMemcpy(fr, f.data(), hd * 2, cudaMemcpyHostToDevice);
    cudaMalloc(&po, (size_t)128 * rows * nh * hd * 4); cudaMalloc(&pml, 128 * rows * nh * 2 * 4);
    int hl[2] = {first_pos, kv_len}; cudaMalloc(&lens, 8); cudaMemcpy(lens, hl, 8, cudaMemcpyHostToDevice);
    const float eps = 1e-6f;
    auto rope = [&](int c) { qkv_rope_append_f32<<<rows * heads, 64>>>(qkv, qn, kn, fr, q, ks[c], vs[c], nh, nkv, hd, lens, eps); };
    auto attn = [&](int c) {
        attention_split_q1_hd128_f32<<<dim3(nkv, splits), 128>>>(q, ks[c], vs[c], po, pml, rows, nh, nkv, lens, 1, keys);
    };
    auto fold = [&](int c) {
        attention_split_rope_q1_hd128_f32<<<dim3(nkv, splits), 128>>>(qkv, qn, kn, fr, ks[c], vs[c], po, pml, rows, nh, nkv, lens, 1, keys, eps);
    };
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    auto time = [&](auto body) {
        for (int i = 0; i < 10; i++) body(i % COPIES);
        float ms; cudaEventRecord(e0);
        for (int i = 0; i < iters; i++) body(i % COPIES);
        cudaEventRecord(e1); cudaEventSynchronize(e1); cudaEventElapsedTime(&ms, e0, e1);
        return ms * 1000.f / iters;
    };
    for (int round = 0; round < 2; round++) {
        const float t_rope = time(rope), t_attn = time(attn);
        const float t_two = time([&](int c) { rope(c); attn(c); }), t_fold = time(fold);
        printf("q1 ctx %d splits %d: rope %.2f attn %.2f rope+attn %.2f folded %.2f us\n", ctx, splits,
               t_rope, t_attn, t_two, t_fold);
    }
    return cudaGetLastError() != cudaSuccess;
}
