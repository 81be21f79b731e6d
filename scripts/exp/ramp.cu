// Experiment: where a one-wave matvec's time beyond bytes/bandwidth goes. Per-block start/end
// (globaltimer) of matvec_tc, and a plain streaming-read kernel of the same bytes for contrast.
// nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/ramp.cu -o /tmp/ramp
#include "../../kernels/matvec.cu"
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cuda_runtime.h>

__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t;
}
template <int U, int MINB>
__global__ void __launch_bounds__(256, MINB) timed(const __nv_bfloat16* w, const float* x, float* y, int m, int in, int out, int ks, unsigned long long* tr) {
    unsigned long long t0 = gtime();
    matvec_tc<U, false, false, false>(w, x, y, m, in, out, 0, ks, nullptr, 0, 0.f, nullptr, nullptr, nullptr, ArgmaxOut{});
    __syncthreads();
    if (threadIdx.x == 0) { unsigned smid; asm("mov.u32 %0, %smid;" : "=r"(smid)); tr[3 * blockIdx.x] = t0; tr[3 * blockIdx.x + 1] = gtime(); tr[3 * blockIdx.x + 2] = smid; }
}
__global__ void readk(const uint4* p, size_t n, float* sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = ldg_stream(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678) sink[0] = 1.f;
}
__global__ void scrub(float* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += 1.f;
}
int main() {
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    size_t scrub_n = 512ull << 20 >> 2; float* sb; cudaMalloc(&sb, scrub_n * 4);
    float *x, *y; cudaMalloc(&x, 8 * 12288 * 4); cudaMalloc(&y, 8 * 24576 * 4);  // y: gate|up has 24576 rows cudaMemset(x, 0, 8 * 12288 * 4);
    unsigned long long* tr; cudaMalloc(&tr, 3 * 4096 * 8);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    struct S { const char* name; int out, in, ks, u; } shapes[] = {{"o", 4096, 4096, 8, 4}, {"qkv", 6144, 4096, 8, 2}, {"down", 4096, 12288, 8, 4}, {"gate|up", 24576, 4096, 2, 2}};
    const int COPIES = 6;
    for (auto& s : shapes) {
        size_t bytes = (size_t)s.out * s.in * 2;
        std::vector<__nv_bfloat16*> ws(COPIES);
        for (auto& w : ws) { cudaMalloc(&w, bytes); cudaMemset(w, 0, bytes); }
        int blocks = (s.out / 16) / (8 / s.ks);
        auto mv = [&](int i, int m) {
            if (s.u == 2) timed<2, 3><<<blocks, 256>>>(ws[i % COPIES], x, y, m, s.in, s.out, s.ks, tr);
            else timed<4, 2><<<blocks, 256>>>(ws[i % COPIES], x, y, m, s.in, s.out, s.ks, tr);
        };
        for (int m : {1, 7}) {
            // back-to-back, rotating copies (no L2 reuse): mean per launch
            mv(0, m); cudaDeviceSynchronize();
            cudaEventRecord(e0); for (int i = 0; i < 60; i++) mv(i, m); cudaEventRecord(e1); cudaEventSynchronize(e1);
            float ms; cudaEventElapsedTime(&ms, e0, e1);
            // one cold launch, trace its blocks
            scrub<<<4 * sms, 512>>>(sb, scrub_n); mv(1, m); cudaDeviceSynchronize();
            std::vector<unsigned long long> h(3 * blocks); cudaMemcpy(h.data(), tr, 3 * blocks * 8, cudaMemcpyDeviceToHost);
            unsigned long long t0 = ~0ull; for (int b = 0; b < blocks; b++) t0 = std::min(t0, h[3 * b]);
            std::vector<double> st, en, du;
            for (int b = 0; b < blocks; b++) { st.push_back((h[3*b]-t0)/1e3); en.push_back((h[3*b+1]-t0)/1e3); du.push_back((h[3*b+1]-h[3*b])/1e3); }
            std::sort(st.begin(), st.end()); std::sort(en.begin(), en.end()); std::sort(du.begin(), du.end());
            auto q = [&](std::vector<double>& v, double f) { return v[std::min((size_t)(f * v.size()), v.size() - 1)]; };
            // Is a block's lateness a property of its SM? Two more cold traces; per-SM mean end
            // time in each, their correlation and the slowest SMs of both.
            if (getenv("SMS")) {
                std::vector<std::vector<double>> per(2, std::vector<double>(sms, 0.0)); std::vector<int> cnt(sms, 0);
                for (int rep = 0; rep < 2; rep++) {
                    scrub<<<4 * sms, 512>>>(sb, scrub_n); mv(2 + rep, m); cudaDeviceSynchronize();
                    std::vector<unsigned long long> g(3 * blocks); cudaMemcpy(g.data(), tr, 3 * blocks * 8, cudaMemcpyDeviceToHost);
                    unsigned long long a = ~0ull; for (int b = 0; b < blocks; b++) a = std::min(a, g[3 * b]);
                    std::fill(cnt.begin(), cnt.end(), 0);
                    for (int b = 0; b < blocks; b++) { int sm = (int)g[3*b+2]; per[rep][sm] += (g[3*b+1]-a)/1e3; cnt[sm]++; }
                    for (int i = 0; i < sms; i++) if (cnt[i]) per[rep][i] /= cnt[i];
                }
                double ma = 0, mb = 0; int n = 0; for (int i = 0; i < sms; i++) if (cnt[i]) { ma += per[0][i]; mb += per[1][i]; n++; }
                ma /= n; mb /= n; double sab = 0, saa = 0, sbb = 0;
                for (int i = 0; i < sms; i++) if (cnt[i]) { sab += (per[0][i]-ma)*(per[1][i]-mb); saa += (per[0][i]-ma)*(per[0][i]-ma); sbb += (per[1][i]-mb)*(per[1][i]-mb); }
                std::vector<int> idx; for (int i = 0; i < sms; i++) if (cnt[i]) idx.push_back(i);
                std::sort(idx.begin(), idx.end(), [&](int x, int y) { return per[0][x] + per[1][x] > per[0][y] + per[1][y]; });
                printf("%-8s m=%d per-SM end: corr %.2f between two cold launches; slowest SMs:", s.name, m, sab / sqrt(saa * sbb));
                for (int i = 0; i < 12 && i < (int)idx.size(); i++) printf(" %d(%.1f/%.1f)", idx[i], per[0][idx[i]], per[1][idx[i]]);
                printf("; fastest:");
                for (int i = 0; i < 6; i++) { int k = idx[idx.size() - 1 - i]; printf(" %d(%.1f/%.1f)", k, per[0][k], per[1][k]); }
                printf("\n");
            }
            float hot; { cudaEventRecord(e0); for (int i = 0; i < 60; i++) mv(0, m); cudaEventRecord(e1); cudaEventSynchronize(e1); cudaEventElapsedTime(&hot, e0, e1); }
            // hot trace: the same copy again, now in L2
            mv(0, m); cudaDeviceSynchronize();
            std::vector<unsigned long long> hh(3 * blocks); cudaMemcpy(hh.data(), tr, 3 * blocks * 8, cudaMemcpyDeviceToHost);
            { unsigned long long a = ~0ull, z = 0; for (int b = 0; b < blocks; b++) { a = std::min(a, hh[3*b]); z = std::max(z, hh[3*b+1]); }
              printf("%-8s m=%d L2-hot b2b %.2f us/launch, hot trace span %.2f us\n", s.name, m, hot * 1000 / 60, (z - a) / 1e3); }
            printf("%-8s m=%d b2b %.2f us/launch (floor %.2f) | cold trace: start last %.2f; end min %.2f p10 %.2f p50 %.2f p90 %.2f max %.2f; block dur p10 %.2f p50 %.2f max %.2f\n",
                   s.name, m, ms * 1000 / 60, bytes / 4.3e6, q(st, 1), q(en, 0), q(en, .1), q(en, .5), q(en, .9), q(en, 1), q(du, .1), q(du, .5), q(du, 1));
        }
        for (int tpb : {1024}) for (int bps : {2}) {
            size_t n = bytes / 16;
            cudaEventRecord(e0); for (int i = 0; i < 60; i++) readk<<<bps * sms, tpb>>>((const uint4*)ws[i % COPIES], n, y); cudaEventRecord(e1); cudaEventSynchronize(e1);
            float ms; cudaEventElapsedTime(&ms, e0, e1);
            printf("   read-only %d x %d threads: b2b %.2f us/launch\n", bps * sms, tpb, ms * 1000 / 60);
        }
        for (auto& w : ws) cudaFree(w);
    }
    printf("status %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
