// Weight-stationary batched matvec: y[m, o] (+)= Σ_k x[m, k] · W[o, k], for a few rows m.
//
// The lever of small-M decoding: each weight byte is read from HBM once for all M activation
// rows, so a projection costs its weight bytes / bandwidth whether M is 1 (decode) or 8
// (verify, draft block). W is [out, in] in the checkpoint dtype, x [M, in] f32, y [M, out] f32.
// `accumulate` adds into y, which fuses the residual add into the projection that feeds it.
//
// Two kernels:
//
// * `matvec_tc_bf16` — the fast path for bf16 weights, M ≤ 8, in % 8 == 0. One block of 8 warps
//   owns a tile of 16 output rows; the warps split K (warp w takes 32-wide k chunks w, w+8, …)
//   and their partial sums are added in a fixed order through shared memory at the end, so the
//   result is deterministic and does not depend on M. Each lane issues 16-byte loads: 8
//   consecutive bf16 of one weight row, four chunks in flight per lane. The multiply runs on the
//   tensor cores (`mma.sync.m16n8k16`, bf16 in, f32 accumulate) with W as the A operand and x as
//   B. Since a sum over k does not care about order, the 8 consecutive k a lane loads are fed as
//   the fragment positions {2t, 2t+1, 2t+8, 2t+9} of two MMAs — A and B use the same mapping, so
//   no shuffles are needed. x stays f32-exact: it is split into three bf16 parts
//   x = hi + mid + lo (8 + 8 + 8 mantissa bits cover f32's 24), each part an n-tile of 8
//   columns (column = activation row m), and the three partial products are added in f32. The
//   tensor cores have throughput to spare for the 3× work; what matters is that every weight
//   byte is loaded once, with wide loads, by enough warps to cover HBM latency.
//   A `swiglu` variant computes x on the fly from the fused gate|up buffer
//   (x[m, k] = silu(gu[m, k]) · gu[m, in + k]), folding the activation into the down projection.
//
// * `matvec_{bf16,f16,f32}` — the general kernel for any dtype and any in: one output row per
//   warp, lanes strided over k, up to 16 rows of x per launch. Prefill chunks, f16/f32
//   checkpoints and odd shapes use it.
#include "common.cuh"

#define MAXM 16

template <typename T>
__device__ void matvec(const T* w, const float* x, float* y, int m, int in, int out, int accumulate) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= out) return;
    float acc[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; r++) acc[r] = 0.f;
    const size_t base = (size_t)warp * in;
    for (int k = lane; k < in; k += 32) {
        float wv = load_w(w, base + k);
#pragma unroll
        for (int r = 0; r < MAXM; r++)
            if (r < m) acc[r] += wv * x[(size_t)r * in + k];
    }
#pragma unroll
    for (int r = 0; r < MAXM; r++) {
        if (r < m) {
            float s = warp_sum(acc[r]);
            if (lane == 0) {
                size_t idx = (size_t)r * out + warp;
                y[idx] = accumulate ? y[idx] + s : s;
            }
        }
    }
}

extern "C" __global__ void matvec_bf16(const __nv_bfloat16* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }
extern "C" __global__ void matvec_f16(const __half* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }
extern "C" __global__ void matvec_f32(const float* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }

// ---- tensor-core path -------------------------------------------------------------------------

#define TC_WARPS 8
#define TC_UNROLL 4

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Splits two f32 values into hi/mid/lo bf16 pairs (x = hi + mid + lo exactly for normal x).
__device__ __forceinline__ void split3(float a, float b, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
    float ah = __bfloat162float(__float2bfloat16_rn(a)), bh = __bfloat162float(__float2bfloat16_rn(b));
    float ar = a - ah, br = b - bh;
    float am = __bfloat162float(__float2bfloat16_rn(ar)), bm = __bfloat162float(__float2bfloat16_rn(br));
    hi = pack_bf16(ah, bh);
    mid = pack_bf16(am, bm);
    lo = pack_bf16(ar - am, br - bm);
}

__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// Loads x[row, k .. k+8) (or the swiglu of the gate|up buffer there) as 8 floats.
template <bool SWIGLU>
__device__ __forceinline__ void load_x8(const float* x, int row, int k, int in, float* v) {
    if (SWIGLU) {
        const float* g = x + (size_t)row * 2 * in + k;
        float4 g0 = *reinterpret_cast<const float4*>(g), g1 = *reinterpret_cast<const float4*>(g + 4);
        float4 u0 = *reinterpret_cast<const float4*>(g + in), u1 = *reinterpret_cast<const float4*>(g + in + 4);
        v[0] = silu(g0.x) * u0.x; v[1] = silu(g0.y) * u0.y; v[2] = silu(g0.z) * u0.z; v[3] = silu(g0.w) * u0.w;
        v[4] = silu(g1.x) * u1.x; v[5] = silu(g1.y) * u1.y; v[6] = silu(g1.z) * u1.z; v[7] = silu(g1.w) * u1.w;
    } else {
        const float* p = x + (size_t)row * in + k;
        float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
}

template <bool SWIGLU>
__device__ void matvec_tc(const __nv_bfloat16* __restrict__ w, const float* __restrict__ x, float* y, int m, int in,
                          int out, int accumulate) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int ra = min(row0 + g, out - 1), rb = min(row0 + g + 8, out - 1);  // clamped: loads stay in bounds
    const uint4* wa = reinterpret_cast<const uint4*>(w + (size_t)ra * in);
    const uint4* wb = reinterpret_cast<const uint4*>(w + (size_t)rb * in);
    const bool has_x = g < m;

    float acc[3][4];
#pragma unroll
    for (int p = 0; p < 3; p++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[p][i] = 0.f;

    const int stride = TC_WARPS * 32;  // k advanced by the block per chunk round
    for (int base = warp * 32 + 8 * t; base < in; base += stride * TC_UNROLL) {
        uint4 va[TC_UNROLL], vb[TC_UNROLL];
        float xv[TC_UNROLL][8];
#pragma unroll
        for (int u = 0; u < TC_UNROLL; u++) {
            int k = base + u * stride;
            if (k < in) {
                va[u] = __ldg(wa + k / 8);
                vb[u] = __ldg(wb + k / 8);
            } else {
                va[u] = make_uint4(0, 0, 0, 0);
                vb[u] = make_uint4(0, 0, 0, 0);
            }
            if (has_x && k < in) {
                load_x8<SWIGLU>(x, g, k, in, xv[u]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) xv[u][i] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < TC_UNROLL; u++) {
            uint32_t h[4], md[4], lo[4];
#pragma unroll
            for (int j = 0; j < 4; j++) split3(xv[u][2 * j], xv[u][2 * j + 1], h[j], md[j], lo[j]);
            // MMA 0: real k +0..+3; MMA 1: real k +4..+7 (see the header for the mapping).
            mma_bf16(acc[0], va[u].x, vb[u].x, va[u].y, vb[u].y, h[0], h[1]);
            mma_bf16(acc[1], va[u].x, vb[u].x, va[u].y, vb[u].y, md[0], md[1]);
            mma_bf16(acc[2], va[u].x, vb[u].x, va[u].y, vb[u].y, lo[0], lo[1]);
            mma_bf16(acc[0], va[u].z, vb[u].z, va[u].w, vb[u].w, h[2], h[3]);
            mma_bf16(acc[1], va[u].z, vb[u].z, va[u].w, vb[u].w, md[2], md[3]);
            mma_bf16(acc[2], va[u].z, vb[u].z, va[u].w, vb[u].w, lo[2], lo[3]);
        }
    }

    // C fragment: c0, c1 = (row g, cols 2t, 2t+1); c2, c3 = (row g+8, cols 2t, 2t+1); col = m.
    __shared__ float part[TC_WARPS][16][8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float s = (acc[2][i] + acc[1][i]) + acc[0][i];
        int r = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        part[warp][r][col] = s;
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        int r = threadIdx.x >> 3, col = threadIdx.x & 7;
        int o = row0 + r;
        if (col < m && o < out) {
            float s = 0.f;
#pragma unroll
            for (int wi = 0; wi < TC_WARPS; wi++) s += part[wi][r][col];
            size_t idx = (size_t)col * out + o;
            y[idx] = accumulate ? y[idx] + s : s;
        }
    }
}

extern "C" __global__ void __launch_bounds__(TC_WARPS * 32)
    matvec_tc_bf16(const __nv_bfloat16* w, const float* x, float* y, int m, int in, int out, int acc) {
    matvec_tc<false>(w, x, y, m, in, out, acc);
}

// x is the [m, 2·in] gate|up buffer; the matvec input is silu(gate) ⊙ up.
extern "C" __global__ void __launch_bounds__(TC_WARPS * 32)
    matvec_tc_swiglu_bf16(const __nv_bfloat16* w, const float* gate_up, float* y, int m, int in, int out, int acc) {
    matvec_tc<true>(w, gate_up, y, m, in, out, acc);
}
