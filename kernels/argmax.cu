// Argmax over each row of logits: the greedy token, lowest index on ties, NaN never wins.
//
// logits [rows, vocab] f32 with a row stride (so one slot of a block can be reduced alone);
// out [rows] u32.
//
// `argmax_f32`: one block of 1024 threads per row; each thread scans a strided subset, then a
// shared-memory tree keeps (value, index) pairs, preferring the lower index. Simple, but a
// 152k-entry row then streams through one SM.
//
// `argmax_split_f32`: the fast path. Grid (segments, rows): every block reduces one segment of a
// row to a (value, index) pair in `partial`; the last block of a row to finish (counted with an
// atomic ticket after a memory fence) reduces that row's pairs and resets the ticket, so the
// whole argmax is one launch and the counters are ready for the next. The result does not depend
// on the order blocks finish: the pair order (higher value, then lower index) is total.
// `argmax_gather_*`: the same, and the last block then copies the winner's row of a table.
#include "common.cuh"

// Reduces one (value, index) pair per thread to thread 0 (blockDim.x a power of two ≤ 1024).
__device__ __forceinline__ void block_argmax(float& best, uint32_t& bi) {
    __shared__ float sv[1024];
    __shared__ uint32_t si[1024];
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            si[threadIdx.x] = si[threadIdx.x + s];
        }
        __syncthreads();
    }
    best = sv[0];
    bi = si[0];
}

extern "C" __global__ void argmax_f32(const float* logits, uint32_t* out, int vocab, int row_stride) {
    const float* x = logits + (size_t)blockIdx.x * row_stride;
    float best = -INFINITY;
    uint32_t bi = 0xffffffffu;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (v > best) { best = v; bi = i; }
    }
    block_argmax(best, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi == 0xffffffffu ? 0u : bi;
}

// partial [rows, segments] pairs; tickets [rows] start at zero and are left at zero. With
// dim > 0 the last block also gathers table[token, 0..dim) (widened to f32) into
// gathered[row, :] — the Markov chain's next W1 row (markov.cu), so that step needs no launch.
template <typename T>
__device__ void argmax_split(const float* logits, uint32_t* out, float* partial_v, uint32_t* partial_i,
                             uint32_t* tickets, int vocab, int row_stride, const T* table, float* gathered, int dim) {
    pdl_trigger();
    pdl_wait();
    const int seg = blockIdx.x, segs = gridDim.x, row = blockIdx.y;
    const int len = (vocab + segs - 1) / segs;
    const int lo = seg * len, hi = min(vocab, lo + len);
    const float* x = logits + (size_t)row * row_stride;
    float best = -INFINITY;
    uint32_t bi = 0xffffffffu;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = x[i];
        if (v > best) { best = v; bi = i; }
    }
    block_argmax(best, bi);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        partial_v[row * segs + seg] = best;
        partial_i[row * segs + seg] = bi;
        __threadfence();
        last = atomicAdd(&tickets[row], 1u) == (uint32_t)segs - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = -INFINITY;
    bi = 0xffffffffu;
    for (int s = threadIdx.x; s < segs; s += blockDim.x) {
        float v = ((volatile float*)partial_v)[row * segs + s];
        uint32_t i = ((volatile uint32_t*)partial_i)[row * segs + s];
        if (better(v, i, best, bi)) { best = v; bi = i; }
    }
    block_argmax(best, bi);  // every thread gets the winner
    const uint32_t token = bi == 0xffffffffu ? 0u : bi;
    if (threadIdx.x == 0) {
        out[row] = token;
        tickets[row] = 0;
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        gathered[(size_t)row * dim + i] = load_w(table, (size_t)token * dim + i);
}

extern "C" __global__ void argmax_split_f32(const float* logits, uint32_t* out, float* partial_v, uint32_t* partial_i,
                                            uint32_t* tickets, int vocab, int row_stride) {
    argmax_split<float>(logits, out, partial_v, partial_i, tickets, vocab, row_stride, nullptr, nullptr, 0);
}

#define ARGMAX_GATHER(NAME, T)                                                                                    \
    extern "C" __global__ void NAME(const float* logits, uint32_t* out, float* partial_v, uint32_t* partial_i,    \
                                    uint32_t* tickets, int vocab, int row_stride, const T* table, float* gathered, \
                                    int dim) {                                                                    \
        argmax_split<T>(logits, out, partial_v, partial_i, tickets, vocab, row_stride, table, gathered, dim);     \
    }
ARGMAX_GATHER(argmax_gather_bf16, __nv_bfloat16)
ARGMAX_GATHER(argmax_gather_f16, __half)
ARGMAX_GATHER(argmax_gather_f32, float)
