// Probe (branch w8a8, not the engine): how fast can a small-M FP8 matvec stream Qwen3-8B's
// projections when x is quantized to E4M3 per (row, 128-k group) the way Qwen / vLLM / transformers
// run `Qwen3-8B-FP8` (W8A8, `activation_scheme: dynamic`), so the m16n8k32 E4M3 MMA takes the
// weight bytes as they lie in memory (no widening), against the same tiling doing today's
// arithmetic (weights widened to f16, x in two f16 parts as MMA columns: W8A16).
//
// Both kernels: one block per 16-row tile, KS warps splitting its K range by 128-k groups
// (group j of warp w: w + KS·j), D groups of weights in flight a lane (register ring), the warps'
// partial tiles summed in a fixed order at the end. A lane's 16 consecutive bytes of a row are
// its k slots of the MMA (the same permutation on x), as in kernels/fp8.cuh.
//
// nvcc -O3 -std=c++17 -arch=sm_90a probe/w8a8.cu -o /tmp/w8a8 && /tmp/w8a8
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ void mma_e4m3(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
    uint32_t r;
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(v));
    return r;
}
__device__ __forceinline__ uint4 e4m3x8_to_f16(const uint4& v, int h) {
    const uint32_t a = h ? v.z : v.x, b = h ? v.w : v.y;
    return make_uint4(e4m3x2_to_f16x2(a), e4m3x2_to_f16x2(a >> 16), e4m3x2_to_f16x2(b), e4m3x2_to_f16x2(b >> 16));
}

// x [m, K] f32 → xq [m, K] E4M3 and sx [m, K/128] (amax / 448; x / sx rounded to nearest,
// saturating), one warp a group.
__global__ void quant_x_e4m3(const float* x, uint8_t* xq, float* sx, int m, int K) {
    const int grp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int groups = K >> 7;
    if (grp >= m * groups) return;
    const int r = grp / groups, gi = grp % groups;
    const float4 v = *reinterpret_cast<const float4*>(x + (size_t)r * K + gi * 128 + 4 * lane);
    float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float s = a / 448.f;
    const float2 p0 = s > 0.f ? make_float2(v.x / s, v.y / s) : make_float2(0.f, 0.f);
    const float2 p1 = s > 0.f ? make_float2(v.z / s, v.w / s) : make_float2(0.f, 0.f);
    const uint32_t q = (uint32_t)__nv_cvt_float2_to_fp8x2(p0, __NV_SATFINITE, __NV_E4M3) |
                       ((uint32_t)__nv_cvt_float2_to_fp8x2(p1, __NV_SATFINITE, __NV_E4M3) << 16);
    *reinterpret_cast<uint32_t*>(xq + (size_t)r * K + gi * 128 + 4 * lane) = q;
    if (lane == 0) sx[r * groups + gi] = s;
}

// x [m, K] f32 → two f16 parts [2m, K] (row 2r + p), 2^s per row putting max|x| in [2^14, 2^15)
// (today's split_x_f16x2 arithmetic), xs2 [m] = 2^-s. One block a row.
__global__ void split_x_f16(const float* x, __half* parts, float* inv, int m, int K) {
    const int r = blockIdx.x;
    __shared__ float wm[32];
    float a = 0.f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) a = fmaxf(a, fabsf(x[(size_t)r * K + k]));
    for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = a;
    __syncthreads();
    a = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) a = fmaxf(a, wm[w]);
    const int e = (int)((__float_as_uint(a) >> 23) & 0xffu) - 127;
    const int s = max(-126, min(126, 14 - e));
    const float up = __uint_as_float((uint32_t)(127 + s) << 23);
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        const float y = x[(size_t)r * K + k] * up;
        const __half h = __float2half_rn(y);
        parts[(size_t)(2 * r) * K + k] = h;
        parts[(size_t)(2 * r + 1) * K + k] = __float2half_rn(y - __half2float(h));
    }
    if (threadIdx.x == 0) inv[r] = __uint_as_float((uint32_t)(127 - s) << 23);
}

// W8A8: y [m, N] = per group (sw · sx) · Σ e4m3(w) · e4m3(xq). m ≤ 8 (one n-tile of MMA columns).
template <int KS, int D>
__global__ void __launch_bounds__(KS * 32) w8a8_matvec(const uint8_t* __restrict__ w, const float* __restrict__ sw,
                                                      const uint8_t* __restrict__ xq, const float* __restrict__ sx,
                                                      float* __restrict__ y, int N, int K, int m) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 16, groups = K >> 7;
    const uint8_t* wa = w + (size_t)(r0 + g) * K + 16 * t;
    const uint8_t* wb = wa + (size_t)8 * K;
    const uint8_t* xr = xq + (size_t)min(g, m - 1) * K + 16 * t;
    const float* swr = sw + (size_t)(r0 >> 7) * groups;
    const int c0 = min(2 * t, m - 1), c1 = min(2 * t + 1, m - 1);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint4 buf[D][4];
    const int ng = (groups - warp + KS - 1) / KS;  // this warp's groups: warp + KS·j
    auto load = [&](uint4* b, int j) {
        const int k = (warp + KS * j) * 128;
        b[0] = ldg_stream(wa + k);
        b[1] = ldg_stream(wb + k);
        b[2] = ldg_stream(wa + k + 64);
        b[3] = ldg_stream(wb + k + 64);
    };
#pragma unroll
    for (int d = 0; d < D; d++)
        if (d < ng) load(buf[d], d);
    for (int j0 = 0; j0 < ng; j0 += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int j = j0 + d;
            if (j < ng) {
                const int gi = warp + KS * j, k = gi * 128;
                const uint4 x0 = *reinterpret_cast<const uint4*>(xr + k);
                const uint4 x1 = *reinterpret_cast<const uint4*>(xr + k + 64);
                float tmp[4] = {0.f, 0.f, 0.f, 0.f};
                mma_e4m3(tmp, buf[d][0].x, buf[d][1].x, buf[d][0].y, buf[d][1].y, x0.x, x0.y);
                mma_e4m3(tmp, buf[d][0].z, buf[d][1].z, buf[d][0].w, buf[d][1].w, x0.z, x0.w);
                mma_e4m3(tmp, buf[d][2].x, buf[d][3].x, buf[d][2].y, buf[d][3].y, x1.x, x1.y);
                mma_e4m3(tmp, buf[d][2].z, buf[d][3].z, buf[d][2].w, buf[d][3].w, x1.z, x1.w);
                if (j + D < ng) load(buf[d], j + D);
                const float s = swr[gi];
                const float s0 = s * sx[c0 * groups + gi], s1 = s * sx[c1 * groups + gi];
                acc[0] = fmaf(s0, tmp[0], acc[0]);
                acc[1] = fmaf(s1, tmp[1], acc[1]);
                acc[2] = fmaf(s0, tmp[2], acc[2]);
                acc[3] = fmaf(s1, tmp[3], acc[3]);
            }
        }
    }
    __shared__ float part[KS][32][4];
#pragma unroll
    for (int i = 0; i < 4; i++) part[warp][lane][i] = acc[i];
    __syncthreads();
    if (warp == 0) {
        for (int v = 1; v < KS; v++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[i] += part[v][lane][i];
        if (2 * t < m) {
            y[(size_t)(2 * t) * N + r0 + g] = acc[0];
            y[(size_t)(2 * t) * N + r0 + g + 8] = acc[2];
        }
        if (2 * t + 1 < m) {
            y[(size_t)(2 * t + 1) * N + r0 + g] = acc[1];
            y[(size_t)(2 * t + 1) * N + r0 + g + 8] = acc[3];
        }
    }
}

// W8A16 (today's arithmetic) in the same tiling: weights widened to f16, x's two f16 parts as
// MMA columns (column 2r + p), NT n-tiles (m ≤ 4·NT), per 64-k chunk fresh sums scaled by sw.
template <int KS, int D, int NT>
__global__ void __launch_bounds__(KS * 32) w8a16_matvec(const uint8_t* __restrict__ w, const float* __restrict__ sw,
                                                       const __half* __restrict__ parts, const float* __restrict__ inv,
                                                       float* __restrict__ y, int N, int K, int m) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 16, groups = K >> 7;
    const uint8_t* wa = w + (size_t)(r0 + g) * K + 16 * t;
    const uint8_t* wb = wa + (size_t)8 * K;
    const __half* xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) xr[j] = parts + (size_t)min(8 * j + g, 2 * m - 1) * K + 16 * t;
    const float* swr = sw + (size_t)(r0 >> 7) * groups;
    float acc[NT][4] = {};
    uint4 buf[D][4];
    const int ng = (groups - warp + KS - 1) / KS;
    auto load = [&](uint4* b, int j) {
        const int k = (warp + KS * j) * 128;
        b[0] = ldg_stream(wa + k);
        b[1] = ldg_stream(wb + k);
        b[2] = ldg_stream(wa + k + 64);
        b[3] = ldg_stream(wb + k + 64);
    };
#pragma unroll
    for (int d = 0; d < D; d++)
        if (d < ng) load(buf[d], d);
    for (int j0 = 0; j0 < ng; j0 += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int jj = j0 + d;
            if (jj < ng) {
                const int gi = warp + KS * jj, k = gi * 128;
                const float s = swr[gi];
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float tmp[NT][4] = {};
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint4 fa = e4m3x8_to_f16(buf[d][2 * c], h), fb = e4m3x8_to_f16(buf[d][2 * c + 1], h);
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            const uint4 xv = *reinterpret_cast<const uint4*>(xr[j] + k + 64 * c + 8 * h);
                            mma_f16(tmp[j], fa.x, fb.x, fa.y, fb.y, xv.x, xv.y);
                            mma_f16(tmp[j], fa.z, fb.z, fa.w, fb.w, xv.z, xv.w);
                        }
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int i = 0; i < 4; i++) acc[j][i] = fmaf(s, tmp[j][i], acc[j][i]);
                }
                if (jj + D < ng) load(buf[d], jj + D);
            }
        }
    }
    __shared__ float part[KS][32][4 * NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) part[warp][lane][4 * j + i] = acc[j][i];
    __syncthreads();
    if (warp == 0) {
        for (int v = 1; v < KS; v++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[j][i] += part[v][lane][4 * j + i];
        // Columns 2t (part 0) and 2t + 1 (part 1) of n-tile j are row 4j + t's two parts.
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int r = 4 * j + t;
            if (r < m) {
                y[(size_t)r * N + r0 + g] = (acc[j][0] + acc[j][1]) * inv[r];
                y[(size_t)r * N + r0 + g + 8] = (acc[j][2] + acc[j][3]) * inv[r];
            }
        }
    }
}

// ---- host ----
static float e4m3_f(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, mnt = b & 7;
    float v = e == 0 ? ldexpf((float)mnt, -9) : ldexpf(1.f + mnt / 8.f, e - 7);
    if (e == 15 && mnt == 7) v = NAN;
    return s ? -v : v;
}
static uint32_t rng = 12345;
static uint32_t next_u() {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}
static float uni() { return (next_u() >> 8) * (1.f / 16777216.f) * 2.f - 1.f; }

struct Shape {
    const char* name;
    int N, K;
};

int main() {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("probe w8a8: %s (sm_%d%d), %d SMs\n", p.name, p.major, p.minor, p.multiProcessorCount);
    // Copy ceiling: read + write bytes of a 1 GB device-to-device copy.
    const size_t cb = (size_t)1 << 30;
    void *ca, *cbuf;
    CK(cudaMalloc(&ca, cb));
    CK(cudaMalloc(&cbuf, cb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(cbuf, ca, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 5; i++) CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double ceil_gbs = 2.0 * 5 * cb / (ms * 1e-3) / 1e9;
    printf("copy ceiling %.0f GB/s\n", ceil_gbs);
    CK(cudaFree(ca));
    CK(cudaFree(cbuf));

    float lut[256];
    for (int b = 0; b < 256; b++) lut[b] = e4m3_f((uint8_t)b);
    const Shape shapes[] = {{"q|k|v", 6144, 4096}, {"o", 4096, 4096}, {"gate|up", 24576, 4096}, {"down", 4096, 12288}};
    const int rows_list[] = {1, 8};
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    for (const Shape& sh : shapes) {
        const int N = sh.N, K = sh.K, G = K / 128;
        const size_t wbytes = (size_t)N * K;
        const int copies = (int)std::max<size_t>(2, ((size_t)1 << 30) / wbytes);
        std::vector<uint8_t> hw(wbytes);
        for (auto& b : hw) {
            uint8_t v = next_u() & 0xff;
            if ((v & 0x7f) == 0x7f) v ^= 1;  // no NaN code
            // Keep magnitudes moderate: exponent field ≤ 9 (|w| < 8).
            if (((v >> 3) & 15) > 9) v = (v & 0x87) | (9 << 3);
            b = v;
        }
        std::vector<float> hsw((size_t)(N / 128) * G);
        for (auto& s : hsw) s = 1e-3f * (1.5f + uni());
        uint8_t* dw;
        float* dsw;
        CK(cudaMalloc(&dw, wbytes * copies));
        for (int c = 0; c < copies; c++) CK(cudaMemcpy(dw + c * wbytes, hw.data(), wbytes, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dsw, hsw.size() * 4));
        CK(cudaMemcpy(dsw, hsw.data(), hsw.size() * 4, cudaMemcpyHostToDevice));
        for (int m : rows_list) {
            std::vector<float> hx((size_t)m * K);
            for (size_t i = 0; i < hx.size(); i++) hx[i] = uni() * (i % 97 == 0 ? 40.f : 1.f);
            float *dx, *dsx, *dy, *dinv;
            uint8_t* dxq;
            __half* dparts;
            CK(cudaMalloc(&dx, hx.size() * 4));
            CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMalloc(&dxq, (size_t)m * K));
            CK(cudaMalloc(&dsx, (size_t)m * G * 4));
            CK(cudaMalloc(&dy, (size_t)m * N * 4));
            CK(cudaMalloc(&dparts, (size_t)2 * m * K * 2));
            CK(cudaMalloc(&dinv, m * 4));
            quant_x_e4m3<<<(m * G + 7) / 8, 256, 0, st>>>(dx, dxq, dsx, m, K);
            split_x_f16<<<m, 256, 0, st>>>(dx, dparts, dinv, m, K);
            CK(cudaStreamSynchronize(st));
            std::vector<uint8_t> hxq((size_t)m * K);
            std::vector<float> hsx((size_t)m * G);
            CK(cudaMemcpy(hxq.data(), dxq, hxq.size(), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hsx.data(), dsx, hsx.size() * 4, cudaMemcpyDeviceToHost));
            // Host references on every 13th weight row, once: W8A8 and exact f32 x, in double.
            std::vector<double> ra8, rx, rmag;
            for (int r = 0; r < m; r++)
                for (int n = 0; n < N; n += 13) {
                    double ya8 = 0.0, yx = 0.0, mag = 0.0;
                    for (int gi = 0; gi < G; gi++) {
                        double s8 = 0.0, sxx = 0.0, sm = 0.0;
                        for (int k = gi * 128; k < gi * 128 + 128; k++) {
                            const double wv = lut[hw[(size_t)n * K + k]];
                            const double xv = hx[(size_t)r * K + k];
                            s8 += wv * lut[hxq[(size_t)r * K + k]];
                            sxx += wv * xv;
                            sm += fabs(wv * xv);
                        }
                        const double s = hsw[(size_t)(n / 128) * G + gi];
                        ya8 += s * hsx[r * G + gi] * s8;
                        yx += s * sxx;
                        mag += s * sm;
                    }
                    ra8.push_back(ya8);
                    rx.push_back(yx);
                    rmag.push_back(mag);
                }
            auto check = [&](const char* what, bool a8, std::vector<float>& got) {
                double worst = 0.0, worst_x = 0.0;
                size_t i = 0;
                for (int r = 0; r < m; r++)
                    for (int n = 0; n < N; n += 13, i++) {
                        const double ref = a8 ? ra8[i] : rx[i];
                        worst = fmax(worst, fabs(got[(size_t)r * N + n] - ref) / rmag[i]);
                        worst_x = fmax(worst_x, fabs(got[(size_t)r * N + n] - rx[i]) / rmag[i]);
                    }
                printf("  %-8s m=%d check %-26s: max |err| / sum|w x|: own arithmetic %.2e, exact f32 x %.2e %s\n",
                       sh.name, m, what, worst, worst_x, worst < (a8 ? 1e-5 : 1e-6) ? "ok" : "FAIL");
            };
            auto run = [&](const char* what, auto launch, bool a8, int iters) {
                CK(cudaMemset(dy, 0xff, (size_t)m * N * 4));  // poison: NaN
                launch(dw, st);
                CK(cudaStreamSynchronize(st));
                CK(cudaGetLastError());
                std::vector<float> got((size_t)m * N);
                CK(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost));
                int bad = 0;
                for (float v : got) bad += !std::isfinite(v);
                if (bad) printf("  %s: %d non-finite outputs (unwritten?)\n", what, bad);
                check(what, a8, got);
                cudaGraph_t gr;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int i = 0; i < iters; i++) launch(dw + (size_t)(i % copies) * wbytes, st);
                CK(cudaStreamEndCapture(st, &gr));
                CK(cudaGraphInstantiate(&ge, gr, 0));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaStreamSynchronize(st));
                float best = 1e30f;
                for (int rep = 0; rep < 5; rep++) {
                    CK(cudaEventRecord(e0, st));
                    CK(cudaGraphLaunch(ge, st));
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float t;
                    CK(cudaEventElapsedTime(&t, e0, e1));
                    best = fminf(best, t);
                }
                const double us = best * 1e3 / iters;
                printf("  %-8s m=%d %-22s %8.2f us  %5.1f%% of ceiling (%.1f MB)\n", sh.name, m, what, us,
                       100.0 * wbytes / (us * 1e-6) / 1e9 / ceil_gbs, wbytes / 1e6);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(gr));
            };
            const int blocks = N / 16, iters = 64;
#define W8A8(KS, D)                                                                                                \
    run("w8a8 KS=" #KS " D=" #D, [&](const uint8_t* w, cudaStream_t s) {                                          \
        w8a8_matvec<KS, D><<<blocks, KS * 32, 0, s>>>(w, dsw, dxq, dsx, dy, N, K, m);                            \
    }, true, iters)
#define W8A16(KS, D, NT)                                                                                           \
    run("w8a16 KS=" #KS " D=" #D, [&](const uint8_t* w, cudaStream_t s) {                                         \
        w8a16_matvec<KS, D, NT><<<blocks, KS * 32, 0, s>>>(w, dsw, dparts, dinv, dy, N, K, m);                   \
    }, false, iters)
            W8A8(4, 2);
            W8A8(4, 4);
            W8A8(8, 2);
            W8A8(8, 3);
            W8A8(8, 4);
            W8A8(16, 2);
            if (m <= 4) {
                W8A16(4, 2, 1);
                W8A16(8, 2, 1);
                W8A16(8, 3, 1);
            } else {
                W8A16(4, 2, 2);
                W8A16(8, 2, 2);
            }
            // The activation step of each arithmetic, alone (a launch each).
            run("quant_x_e4m3 (+w8a8 8,2)", [&](const uint8_t* w, cudaStream_t s) {
                quant_x_e4m3<<<(m * G + 7) / 8, 256, 0, s>>>(dx, dxq, dsx, m, K);
                w8a8_matvec<8, 2><<<blocks, 256, 0, s>>>(w, dsw, dxq, dsx, dy, N, K, m);
            }, true, iters);
            CK(cudaFree(dx));
            CK(cudaFree(dxq));
            CK(cudaFree(dsx));
            CK(cudaFree(dy));
            CK(cudaFree(dparts));
            CK(cudaFree(dinv));
        }
        CK(cudaFree(dw));
        CK(cudaFree(dsw));
    }
    return 0;
}
