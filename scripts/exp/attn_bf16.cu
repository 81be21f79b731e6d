// Harness: the split-attention kernels on a bf16 KV cache (the engine's `_kvbf16` kernels,
// `--kv-cache bf16`) against the same kernels on an f32 cache holding the same (bf16-rounded)
// values — what a bf16 cache saves per launch, and a check that it changes nothing else. Usage: /tmp/attn_bf16 {tc|q1} CTX [ITERS]
// nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/attn_bf16.cu -o /tmp/attn_bf16
//
// The grid is the engine's (ops.rs split_plan: 32-key slices, at most one wave of blocks: 4 per
// SM for q1, 2 for tc); KEYS / SPLITS override it as in attn.cu. Both kernels widen a bf16 tile to
// f32 in shared memory and then do the f32 kernel's math, and the tensor-core kernel's dropped
// products are those with a bf16 operand's small part, which is zero — so the partials, and the
// combined output, must be bit-identical to the f32 kernel's on the rounded cache. The harness
// checks that (outputs poisoned with NaN first) and prints the two kernels' times, alternated in
// ROUNDS blocks of ITERS launches over COPIES rotating cache copies (no L2 reuse).
#include "attention.cu"
#include "attention_tc.cu"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

// f32 → bf16, round to nearest even (finite inputs only, as here).
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int main(int argc, char** argv) {
    const bool tc = argc > 1 && argv[1][0] == 't';
    const int ctx = argc > 2 ? atoi(argv[2]) : 4096, iters = argc > 3 ? atoi(argv[3]) : 60;
    const int nh = 32, nkv = 8, hd = 128, rows = tc ? 8 : 1, COPIES = 6, ROUNDS = 3;
    const int first_pos = ctx, kv_len = ctx + rows;
    int kv_cap = 1;
    while (kv_cap < kv_len) kv_cap *= 2;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int keys = getenv("KEYS") ? atoi(getenv("KEYS")) : 32;
    const int wave = (tc ? 2 : 4) * sms / nkv;  // blocks per slice: one per KV head (one query group)
    const int splits = getenv("SPLITS") ? atoi(getenv("SPLITS")) : std::max(1, std::min({(kv_cap + keys - 1) / keys, wave, 128}));

    // Random values in [-1, 1) rounded to bf16: the f32 cache holds them widened.
    const size_t cache = (size_t)kv_cap * nkv * hd;
    std::vector<uint16_t> hb(cache);
    std::vector<float> hf(cache);
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < cache; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        const float x = (float)((st >> 40) & 0xffffff) / 8388608.f - 1.f;
        hb[i] = to_bf16(x);
        hf[i] = from_bf16(hb[i]);
    }
    std::vector<float*> kf(COPIES), vf(COPIES);
    std::vector<__nv_bfloat16*> kb(COPIES), vb(COPIES);
    for (int c = 0; c < COPIES; c++) {
        cudaMalloc(&kf[c], cache * 4); cudaMalloc(&vf[c], cache * 4);
        cudaMalloc(&kb[c], cache * 2); cudaMalloc(&vb[c], cache * 2);
        // V is K shifted by one row, so the two differ.
        cudaMemcpy(kf[c], hf.data(), cache * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(vf[c], hf.data() + nkv * hd, (cache - nkv * hd) * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(kb[c], hb.data(), cache * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(vb[c], hb.data() + nkv * hd, (cache - nkv * hd) * 2, cudaMemcpyHostToDevice);
    }
    std::vector<float> hq(rows * nh * hd);
    for (auto& x : hq) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        x = (float)((st >> 40) & 0xffffff) / 8388608.f - 1.f;
    }
    float *q, *po, *pml, *out;
    int* lens;
    cudaMalloc(&q, hq.size() * 4);
    cudaMemcpy(q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&po, (size_t)128 * rows * nh * hd * 4);
    cudaMalloc(&pml, 128 * rows * nh * 2 * 4);
    cudaMalloc(&out, rows * nh * hd * 4);
    int hl[2] = {first_pos, kv_len};
    cudaMalloc(&lens, 8);
    cudaMemcpy(lens, hl, 8, cudaMemcpyHostToDevice);
    const int smem = TC_SMEM(128);
    cudaFuncSetAttribute(attention_tc_hd128_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(attention_tc_hd128_f32_kvbf16, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);

    auto attn = [&](bool bf, int c) {
        if (tc) {
            if (bf) attention_tc_hd128_f32_kvbf16<<<dim3(nkv, splits), 256, smem>>>(q, kb[c], vb[c], po, pml, rows, nh, nkv, lens, 1, keys);
            else attention_tc_hd128_f32<<<dim3(nkv, splits), 256, smem>>>(q, kf[c], vf[c], po, pml, rows, nh, nkv, lens, 1, keys);
        } else {
            if (bf) attention_split_q1_hd128_f32_kvbf16<<<dim3(nkv * rows, splits), 128>>>(q, kb[c], vb[c], po, pml, rows, nh, nkv, lens, 1, keys);
            else attention_split_q1_hd128_f32<<<dim3(nkv * rows, splits), 128>>>(q, kf[c], vf[c], po, pml, rows, nh, nkv, lens, 1, keys);
        }
    };
    auto comb = [&]() { attention_combine_f32<<<rows * nh, 4 * hd>>>(po, pml, out, rows, nh, hd, lens, keys, splits); };

    // The check: each kernel once on copy 0, partials and output poisoned first.
    std::vector<float> res[2];
    for (int bf = 0; bf < 2; bf++) {
        cudaMemset(po, 0xff, (size_t)128 * rows * nh * hd * 4);
        cudaMemset(pml, 0xff, 128 * rows * nh * 2 * 4);
        cudaMemset(out, 0xff, rows * nh * hd * 4);
        attn(bf, 0);
        comb();
        res[bf].resize(rows * nh * hd);
        cudaMemcpy(res[bf].data(), out, res[bf].size() * 4, cudaMemcpyDeviceToHost);
    }
    size_t diff = 0, nan = 0;
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < res[0].size(); i++) {
        if (res[0][i] != res[0][i] || res[1][i] != res[1][i]) nan++;
        else if (memcmp(&res[0][i], &res[1][i], 4) != 0) diff++;
        max_diff = std::max(max_diff, (double)std::abs(res[0][i] - res[1][i]));
        max_ref = std::max(max_ref, (double)std::abs(res[0][i]));
    }

    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int i = 0; i < 5; i++) { attn(false, i % COPIES); attn(true, i % COPIES); }
    double us[2] = {0, 0};
    for (int r = 0; r < ROUNDS; r++) {
        for (int bf = 0; bf < 2; bf++) {
            float ms;
            cudaEventRecord(e0);
            for (int i = 0; i < iters; i++) attn(bf, i % COPIES);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms, e0, e1);
            us[bf] += ms * 1000 / iters / ROUNDS;
        }
    }
    const double mb = 2.0 * kv_len * nkv * hd / 1e6;  // bf16 K+V bytes; f32 twice that
    printf("%s ctx %d: grid %dx%d keys %d | f32 cache %.2f us (%.0f GB/s) | bf16 cache %.2f us (%.0f GB/s) | bf16/f32 %.3f | "
           "outputs: %zu differ (max %.3g of max |out| %.3g), %zu NaN of %zu (%s) | %s\n",
           tc ? "tc" : "q1", ctx, tc ? nkv : nkv * rows, splits, keys, us[0], 2 * mb * 1e3 / us[0], us[1], mb * 1e3 / us[1],
           us[1] / us[0], diff, max_diff, max_ref, nan, res[0].size(), diff == 0 && nan == 0 ? "bit-identical: PASS" : "FAIL",
           cudaGetErrorString(cudaDeviceSynchronize()));
    return diff == 0 && nan == 0 ? 0 : 1;
}
