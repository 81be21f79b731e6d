// Random weights for the benchmark: out[i] = bf16(scale · u(seed, i)), u uniform in [−1, 1).
//
// The bench builds Qwen3-8B-shaped models without files, so 16 GB of weights must be made on
// the device: a counter-based hash (SplitMix64 of seed + i) gives every element an independent
// value with no state, in one grid-stride pass at memory speed. Not used on any decoding path.
#include "common.cuh"

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void fill_uniform_bf16(__nv_bfloat16* out, size_t n, uint64_t seed, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = splitmix64(seed * 0x632BE59BD9B4E019ull + i);
        float u = (float)(z >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f;
        out[i] = __float2bfloat16_rn(scale * u);
    }
}

// Random E4M3 bytes for the benchmark's FP8 weights: a hashed byte with exponent bit 3 cleared
// (exponents 0..7: |value| < 2, no NaN code), which the bench scales by its block scales.
extern "C" __global__ void fill_random_fp8(uint8_t* out, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t z = splitmix64(seed * 0x632BE59BD9B4E019ull + i);
        out[i] = (uint8_t)(z >> 56) & 0xbf;
    }
}
