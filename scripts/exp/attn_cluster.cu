// Harness: the decode attention with its combine inside the launch, through a thread-block
// cluster (stop 22). A cluster of CL blocks owns one KV head: block r takes key slice r, exactly
// as the engine's split kernel (kernels/attention.cu attention_split, called as it is: partials
// to global memory), then the cluster meets at one hardware barrier (release / acquire at
// cluster scope: the peers' partials are visible) and block r merges 1/CL of the head's four
// queries × hd outputs from the CL partials. No combine launch and no second grid.
//
// Compared, on the same inputs, back to back over rotating K/V copies (plain stream order):
//   split: the engine's attention_split_q1_hd128_f32 on SPLITS slices + attention_combine_f32;
//   cluster CL = 8 and 16 (16 is a non-portable cluster size; allowed on H100/H200).
// The outputs are checked against the split path to 1e-5 relative (the merge order differs).
// Usage: /tmp/attn_cluster CTX [ITERS]
// nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/attn_cluster.cu -o /tmp/attn_cluster
#include "attention.cu"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// grid (nkv, CL), cluster (1, CL, 1), 128 threads: hd = 128, G = 4, one query row.
extern "C" __global__ void __launch_bounds__(SPLIT_WARPS * 32, 4)
    attention_cluster_q1(const float* q, const float* k, const float* v, float* part_o, float* part_ml, float* out,
                         int nh, int nkv, const int* lens) {
    constexpr int HD = 128, G = 4;
    attention_split<4, 1, float>(q, k, v, part_o, part_ml, 1, nh, nkv, lens, 1, 32);
    cluster_sync_all();
    const int CL = gridDim.y, r = blockIdx.y, kvh = blockIdx.x;
    const int splits = split_count(lens[1], 32, CL);
    // This block's outputs: (query, dim) pairs r·per … of the head's G·HD.
    const int per = G * HD / CL;
    for (int i = threadIdx.x; i < per; i += blockDim.x) {
        const int f = r * per + i, qi = f / HD, d = f % HD;
        const int head = kvh * G + qi;  // one row: slot = split · nh + head
        float M = -INFINITY;
        for (int s = 0; s < splits; s++) M = fmaxf(M, __ldcg(part_ml + ((size_t)s * nh + head) * 2));
        float L = 0.f, acc = 0.f;
        for (int s = 0; s < splits; s++) {
            const size_t slot = (size_t)s * nh + head;
            const float m = __ldcg(part_ml + slot * 2);
            const float w = m == -INFINITY ? 0.f : expf(m - M);
            L += __ldcg(part_ml + slot * 2 + 1) * w;
            acc += __ldcg(part_o + slot * HD + d) * w;
        }
        out[(size_t)head * HD + d] = acc / L;
    }
}

int main(int argc, char** argv) {
    const int ctx = argc > 1 ? atoi(argv[1]) : 512, iters = argc > 2 ? atoi(argv[2]) : 200;
    const int nh = 32, nkv = 8, hd = 128, rows = 1, COPIES = 6;
    const int first_pos = ctx, kv_len = ctx + rows, kv_cap = 4096 + 64;  // the bench's cache
    const int SPLITS = 66;  // ops.rs split_plan on 132 SMs at this cap
    const size_t cache = (size_t)kv_cap * nkv * hd;
    std::vector<float> h(cache);
    for (size_t i = 0; i < cache; i++) h[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
    std::vector<float*> ks(COPIES), vs(COPIES);
    for (int c = 0; c < COPIES; c++) {
        cudaMalloc(&ks[c], cache * 4); cudaMalloc(&vs[c], cache * 4);
        cudaMemcpy(ks[c], h.data(), cache * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(vs[c], h.data(), cache * 4, cudaMemcpyHostToDevice);
    }
    float *q, *po, *pml, *out, *out2; int* lens;
    cudaMalloc(&q, rows * nh * hd * 4); cudaMemcpy(q, h.data(), rows * nh * hd * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&po, (size_t)128 * rows * nh * hd * 4); cudaMalloc(&pml, 128 * rows * nh * 2 * 4);
    cudaMalloc(&out, rows * nh * hd * 4); cudaMalloc(&out2, rows * nh * hd * 4);
    int hl[2] = {first_pos, kv_len}; cudaMalloc(&lens, 8); cudaMemcpy(lens, hl, 8, cudaMemcpyHostToDevice);
    cudaFuncSetAttribute(attention_cluster_q1, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);

    auto split = [&](int c) {
        attention_split_q1_hd128_f32<<<dim3(nkv, SPLITS), 128>>>(q, ks[c], vs[c], po, pml, rows, nh, nkv, lens, 1, 32);
        attention_combine_f32<<<rows * nh, 4 * hd>>>(po, pml, out, rows, nh, hd, lens, 32, SPLITS);
    };
    auto cluster = [&](int c, int CL) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(nkv, CL);
        cfg.blockDim = dim3(128);
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1; at[0].val.clusterDim.y = CL; at[0].val.clusterDim.z = 1;
        cfg.attrs = at; cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, attention_cluster_q1, (const float*)q, (const float*)ks[c], (const float*)vs[c],
                                  po, pml, out2, nh, nkv, (const int*)lens);
    };
    std::vector<float> ref(rows * nh * hd), got(rows * nh * hd);
    split(0); cudaMemcpy(ref.data(), out, ref.size() * 4, cudaMemcpyDeviceToHost);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    const int cls[2] = {8, 16};
    for (int ci = 0; ci < 2; ci++) {
        const int CL = cls[ci];
        cudaMemset(out2, 0xff, got.size() * 4);
        cudaError_t le = cluster(0, CL);
        cudaError_t se = cudaDeviceSynchronize();
        cudaMemcpy(got.data(), out2, got.size() * 4, cudaMemcpyDeviceToHost);
        double worst = 0;
        for (size_t i = 0; i < got.size(); i++)
            worst = std::max(worst, (double)fabsf(got[i] - ref[i]) / std::max(1e-6, (double)fabsf(ref[i])));
        int nclusters = 0;
        cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(nkv, CL); cfg.blockDim = dim3(128);
        cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1; at[0].val.clusterDim.y = CL; at[0].val.clusterDim.z = 1; cfg.attrs = at; cfg.numAttrs = 1;
        cudaOccupancyMaxActiveClusters(&nclusters, attention_cluster_q1, &cfg);
        printf("ctx %d cluster %d: launch %s, run %s, max active clusters %d, worst rel err vs split %.2e %s\n", ctx, CL,
               cudaGetErrorString(le), cudaGetErrorString(se), nclusters, worst, worst < 1e-5 ? "PASS" : "FAIL");
    }
    for (int round = 0; round < 3; round++) {
        float t[3];
        for (int m = 0; m < 3; m++) {
            for (int i = 0; i < 5; i++) { if (m == 0) split(i % COPIES); else cluster(i % COPIES, cls[m - 1]); }
            cudaEventRecord(e0);
            for (int i = 0; i < iters; i++) { if (m == 0) split(i % COPIES); else cluster(i % COPIES, cls[m - 1]); }
            cudaEventRecord(e1); cudaEventSynchronize(e1); cudaEventElapsedTime(&t[m], e0, e1);
            t[m] *= 1000.f / iters;
        }
        printf("ctx %d round %d: split %d + combine %.2f us | cluster 8 %.2f us | cluster 16 %.2f us | %s\n", ctx, round,
               SPLITS, t[0], t[1], t[2], cudaGetErrorString(cudaDeviceSynchronize()));
    }
}
