// Per-head RMSNorm followed by NeoX RoPE, in place: Qwen3's q_norm/k_norm + rotary step.
//
// x is [rows, heads, hd] f32; row r sits at absolute position first_pos + r. For each head
// vector: v = v / sqrt(mean(v²) + eps) · w, then for i < hd/2 with angle = pos · inv_freq[i]:
//   v[i] ← v[i]·cos − v[i+hd/2]·sin,  v[i+hd/2] ← v[i+hd/2]·cos + v[i]·sin.
// inv_freq is precomputed on the host exactly as the CPU reference does. Launch: one block of
// hd/2 threads (rounded up to a warp multiple) per (row, head); hd ≤ 512.
#include "common.cuh"

extern "C" __global__ void qk_norm_rope_f32(float* x, const float* w, const float* inv_freq, int heads, int hd,
                                            int first_pos, float eps) {
    int row = blockIdx.x / heads;
    float* v = x + (size_t)blockIdx.x * hd;
    int half = hd / 2;
    int i = threadIdx.x;
    float a = 0.f, b = 0.f;
    if (i < half) { a = v[i]; b = v[i + half]; }
    float inv = rsqrtf(block_sum(a * a + b * b) / hd + eps);
    if (i < half) {
        a = a * inv * w[i];
        b = b * inv * w[i + half];
        float angle = (float)(first_pos + row) * inv_freq[i];
        float c = cosf(angle), s = sinf(angle);
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}
