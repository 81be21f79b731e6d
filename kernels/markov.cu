// DSpark's sequential heads on the device (DSPARK.md §3), one slot at a time, so the chain
// never returns to the host: the previous token is read from device memory (the anchor, or the
// argmax written for the previous slot), and only the final draft ids are copied back.
//
// The host gathers e₀ = W1[anchor] once (`Gpu::gather_row`: embedding.cu's kernel, one row);
// then per slot s: for the gated / rnn
// variants a single-block prep kernel producing u (g ⊙ e_s, or tanh(o) with the recurrent state);
// then matvec(W2, u) accumulated into the slot's logits, and argmax → token s, whose last block
// also gathers e_{s+1} = W1[token s]. With bf16 W2 and W1 those two are one launch
// (matvec_tc_argmax_bf16 in matvec.cu: the product's epilogue reduces to the token); otherwise
// argmax_gather_* in argmax.cu follows the matvec. The confidence logits of all slots depend only
// on h_s and e_s, so one launch computes them after the chain.
//
// markov_gated_prep_f32: g = σ(G·[h ; e] + b), u = g ⊙ e. G [r, H + r] f32. One block.
// markov_rnn_prep_f32: z = [state ; e ; h]; (g, c, o) = split₃(J·z + b);
//   state ← σ(g)·state + (1 − σ(g))·tanh(c); u = tanh(o). J [3r, 2r + H] f32. One block; the
//   new state is written after all of z has been read.
// confidence_f32: logit[s] = w[0..H)·h_s + (with_markov ? w[H..H+r)·e_s : 0) + b for rows
//   h [rows, H], e [rows, r]. One block of 1024 threads per row (a few loads each, all in flight).
// All four are launched with programmatic dependent launch (see common.cuh): they wait for the
// previous kernel before reading anything, so the chain's launches overlap each other's tails.
#include "common.cuh"

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

extern "C" __global__ void markov_gated_prep_f32(const float* G, const float* b, const float* h, const float* e, float* u,
                                                 int H, int r) {
    pdl_trigger();
    pdl_wait();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int row = warp; row < r; row += nw) {
        const float* g = G + (size_t)row * (H + r);
        float s = 0.f;
        for (int k = lane; k < H; k += 32) s += g[k] * h[k];
        for (int k = lane; k < r; k += 32) s += g[H + k] * e[k];
        s = warp_sum(s);
        if (lane == 0) u[row] = sigmoidf(s + b[row]) * e[row];
    }
}

extern "C" __global__ void markov_rnn_prep_f32(const float* J, const float* b, const float* h, const float* e, float* state,
                                               float* scratch, float* u, int H, int r) {
    // scratch holds the 3r pre-activations so the state is only updated after every row of J
    // has read the old state.
    pdl_trigger();
    pdl_wait();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int in = 2 * r + H;
    for (int row = warp; row < 3 * r; row += nw) {
        const float* j = J + (size_t)row * in;
        float s = 0.f;
        for (int k = lane; k < r; k += 32) s += j[k] * state[k];
        for (int k = lane; k < r; k += 32) s += j[r + k] * e[k];
        for (int k = lane; k < H; k += 32) s += j[2 * r + k] * h[k];
        s = warp_sum(s);
        if (lane == 0) scratch[row] = s + b[row];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
        float g = sigmoidf(scratch[i]);
        state[i] = g * state[i] + (1.f - g) * tanhf(scratch[r + i]);
        u[i] = tanhf(scratch[2 * r + i]);
    }
}

extern "C" __global__ void confidence_f32(const float* w, float b, const float* h, const float* e, float* logit, int H, int r,
                                          int with_markov) {
    pdl_trigger();
    pdl_wait();
    h += (size_t)blockIdx.x * H;
    e += (size_t)blockIdx.x * r;
    float s = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) s += w[i] * h[i];
    if (with_markov)
        for (int i = threadIdx.x; i < r; i += blockDim.x) s += w[H + i] * e[i];
    s = block_sum(s);
    if (threadIdx.x == 0) logit[blockIdx.x] = s + b;
}
