// Embedding gather: out[r, :] = table[ids[r], :] widened to f32.
//
// Layout: table [vocab, dim] row-major in the checkpoint dtype; ids [rows] u32 on the device;
// out [rows, dim] f32. Launch: one block per row, 256 threads striding over dim. Ids are
// checked on the host before they reach the device (the wrapper validates vocab bounds where
// ids come from the host; device-produced ids come from an argmax over the vocabulary).
#include "common.cuh"

template <typename T>
__device__ void embedding(const T* table, const uint32_t* ids, float* out, int dim) {
    pdl_trigger();
    pdl_wait();  // ids may come from the previous kernel
    size_t row = (size_t)ids[blockIdx.x] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)blockIdx.x * dim + i] = load_w(table, row + i);
}

extern "C" __global__ void embedding_bf16(const __nv_bfloat16* t, const uint32_t* ids, float* out, int dim) { embedding(t, ids, out, dim); }
extern "C" __global__ void embedding_f16(const __half* t, const uint32_t* ids, float* out, int dim) { embedding(t, ids, out, dim); }
extern "C" __global__ void embedding_f32(const float* t, const uint32_t* ids, float* out, int dim) { embedding(t, ids, out, dim); }

// Strided row copy: dst[r·dst_stride + c] = src[r·src_stride + c] for c < cols. Moves a layer's
// output rows into their slot of the token-major capture buffer [rows, T·H] the draft reads.
// Launch: one block of 256 threads per row.
extern "C" __global__ void copy_rows_f32(const float* src, float* dst, int cols, int src_stride, int dst_stride) {
    pdl_trigger();
    pdl_wait();
    const float* s = src + (size_t)blockIdx.x * src_stride;
    float* d = dst + (size_t)blockIdx.x * dst_stride;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) d[i] = s[i];
}

// Rows gathered from a table in mapped host memory (`HostTable`: the token embedding kept off the
// device to save its bytes). Every load crosses PCIe, ~1–2 µs a round trip, so each thread issues
// all of its 16-byte loads before it uses any: a row of up to 256 · U · 16 bytes (16 KB: 8,192
// bf16 values) costs one round trip, where the plain loop above would wait once per iteration.
// The wrapper checks that a row is a whole number of 16-byte chunks (the table is page-aligned).
// Launch: one block of 256 threads per row.
template <typename T>
__device__ void embedding_host(const T* table, const uint32_t* ids, float* out, int dim) {
    pdl_trigger();
    pdl_wait();  // ids may come from the previous kernel
    constexpr int PER = 16 / sizeof(T);
    constexpr int U = 4;
    const uint4* row = reinterpret_cast<const uint4*>(table + (size_t)ids[blockIdx.x] * dim);
    float* o = out + (size_t)blockIdx.x * dim;
    const int chunks = dim / PER;
    for (int base = 0; base < chunks; base += U * blockDim.x) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = base + u * blockDim.x + threadIdx.x;
            if (c < chunks) v[u] = row[c];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = base + u * blockDim.x + threadIdx.x;
            if (c < chunks) {
                const T* e = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
                for (int j = 0; j < PER; ++j) o[(size_t)c * PER + j] = load_w(e, j);
            }
        }
    }
}

extern "C" __global__ void embedding_host_bf16(const __nv_bfloat16* t, const uint32_t* ids, float* out, int dim) { embedding_host(t, ids, out, dim); }
extern "C" __global__ void embedding_host_f16(const __half* t, const uint32_t* ids, float* out, int dim) { embedding_host(t, ids, out, dim); }
extern "C" __global__ void embedding_host_f32(const float* t, const uint32_t* ids, float* out, int dim) { embedding_host(t, ids, out, dim); }
