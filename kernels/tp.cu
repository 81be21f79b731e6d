// Tensor parallelism's element-wise ops (issue #32; crates/dspark-model/src/cuda/tp.rs): what a
// rank needs around its collectives that no other kernel does.
//
//   embedding_shard_*: out[r, :] = table[ids[r] − lo, :] if lo ≤ ids[r] < hi, else 0
//                      (a rank's rows lo..hi of the vocabulary; the all-reduce over the ranks
//                      then leaves every row its owner's values exactly: one term is not zero)
//   add_f32:           x[i] += y[i]  (the residual add of an all-reduced partial)
//   take_at_f32:       out[r] = x[r · stride + idx[r]]  (each row's value at its argmax, so the
//                      ranks' candidates gather without their logits leaving the device)
//
// Layout: table [hi − lo, dim] in the checkpoint dtype, ids [rows], out [rows, dim] f32. Launch:
// embedding_shard one block of 256 threads per row; add_f32 a grid-stride loop.
#include "common.cuh"

template <typename T>
__device__ void embedding_shard(const T* table, const uint32_t* ids, float* out, int dim, uint32_t lo, uint32_t hi) {
    pdl_trigger();
    pdl_wait();  // ids may come from the previous kernel
    const uint32_t id = ids[blockIdx.x];
    float* o = out + (size_t)blockIdx.x * dim;
    if (id >= lo && id < hi) {
        const size_t row = (size_t)(id - lo) * dim;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = load_w(table, row + i);
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = 0.f;
    }
}

extern "C" __global__ void embedding_shard_bf16(const __nv_bfloat16* t, const uint32_t* ids, float* out, int dim,
                                                uint32_t lo, uint32_t hi) {
    embedding_shard(t, ids, out, dim, lo, hi);
}
extern "C" __global__ void embedding_shard_f16(const __half* t, const uint32_t* ids, float* out, int dim, uint32_t lo,
                                               uint32_t hi) {
    embedding_shard(t, ids, out, dim, lo, hi);
}
extern "C" __global__ void embedding_shard_f32(const float* t, const uint32_t* ids, float* out, int dim, uint32_t lo,
                                               uint32_t hi) {
    embedding_shard(t, ids, out, dim, lo, hi);
}

extern "C" __global__ void add_f32(float* x, const float* y, int n) {
    pdl_trigger();
    pdl_wait();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += y[i];
}

extern "C" __global__ void take_at_f32(const float* x, const uint32_t* idx, float* out, int stride, int rows) {
    pdl_trigger();
    pdl_wait();
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x)
        out[r] = x[(size_t)r * stride + idx[r]];
}
