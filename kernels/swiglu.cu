// SwiGLU middle of the Qwen3 MLP: h = silu(gate) ⊙ up, silu(x) = x / (1 + e^(−x)).
//
// gate_up is [rows, 2·I]: the fused gate|up projection output (gate in the first I columns,
// up in the last I). out is [rows, I]. Launch: a 1-D grid over rows·I elements.
#include "common.cuh"

extern "C" __global__ void swiglu_f32(const float* gate_up, float* out, int inter, int rows) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * inter) return;
    size_t r = idx / inter, i = idx % inter;
    float g = gate_up[r * 2 * inter + i];
    float u = gate_up[r * 2 * inter + inter + i];
    out[idx] = g / (1.f + expf(-g)) * u;
}
