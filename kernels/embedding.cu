// Embedding gather: out[r, :] = table[ids[r], :] widened to f32.
//
// Layout: table [vocab, dim] row-major in the checkpoint dtype; ids [rows] u32 on the device;
// out [rows, dim] f32. Launch: one block of 256 threads per row. Ids are checked on the host
// before they reach the device (the wrapper validates vocab bounds where ids come from the host;
// device-produced ids come from an argmax over the vocabulary).
//
// Each thread issues all of its 16-byte loads of a row before it uses any (`gather_row_16b`):
// a row of up to 256 · 4 · 16 bytes (16 KB: 8,192 bf16 values) costs one round trip. A plain
// loop of element loads and stores waits once per iteration — out and table may alias as far as
// the compiler knows, so no load moves above the store before it: sixteen round trips for a
// Qwen3-8B row, at the head of every step. Rows that are not whole 16-byte chunks, or a table
// not 16-byte aligned, take the plain loop (the same values). The same kernels read a table in
// mapped host memory (`HostTable`, the token embedding kept off the device), where a round trip
// crosses PCIe (~1–2 µs): its wrapper refuses rows that are not whole 16-byte chunks, and the
// table is page-aligned, so its rows always take the one-round-trip gather.
#include "common.cuh"

// Row `id` of `table` into `o`, every thread's 16-byte loads in flight at once (dim a multiple
// of 16 / sizeof(T), table 16-byte aligned).
template <typename T>
__device__ __forceinline__ void gather_row_16b(const T* table, size_t id, float* o, int dim) {
    constexpr int PER = 16 / sizeof(T);
    constexpr int U = 4;
    const uint4* row = reinterpret_cast<const uint4*>(table + id * dim);
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

template <typename T>
__device__ void embedding(const T* table, const uint32_t* ids, float* out, int dim) {
    pdl_trigger();
    pdl_wait();  // ids may come from the previous kernel
    const size_t id = ids[blockIdx.x];
    float* o = out + (size_t)blockIdx.x * dim;
    if (dim % (16 / sizeof(T)) == 0 && (reinterpret_cast<uintptr_t>(table) & 15) == 0) {
        gather_row_16b(table, id, o, dim);
        return;
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = load_w(table, id * dim + i);
}

extern "C" __global__ void embedding_bf16(const __nv_bfloat16* t, const uint32_t* ids, float* out, int dim) { embedding(t, ids, out, dim); }
extern "C" __global__ void embedding_f16(const __half* t, const uint32_t* ids, float* out, int dim) { embedding(t, ids, out, dim); }
extern "C" __global__ void embedding_f32(const float* t, const uint32_t* ids, float* out, int dim) { embedding(t, ids, out, dim); }

// Strided row copy: dst[r·dst_stride + c] = src[r·src_stride + c] for c < cols. Moves a layer's
// output rows into their slot of the token-major capture buffer [rows, T·H] the draft reads.
// Launch: one block of 256 threads per row. It sits between two layers of every step, so, as
// the gather above, a row whose columns, strides and pointers allow float4s is copied with every
// thread's loads issued first: one round trip, where the element loop waited sixteen times for
// a Qwen3-8B row.
extern "C" __global__ void copy_rows_f32(const float* src, float* dst, int cols, int src_stride, int dst_stride) {
    pdl_trigger();
    pdl_wait();
    const float* s = src + (size_t)blockIdx.x * src_stride;
    float* d = dst + (size_t)blockIdx.x * dst_stride;
    const bool vec = (cols & 3) == 0 && (reinterpret_cast<uintptr_t>(s) & 15) == 0 && (reinterpret_cast<uintptr_t>(d) & 15) == 0;
    if (!vec) {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) d[i] = s[i];
        return;
    }
    constexpr int U = 4;
    const float4* s4 = reinterpret_cast<const float4*>(s);
    float4* d4 = reinterpret_cast<float4*>(d);
    const int chunks = cols / 4;
    for (int base = 0; base < chunks; base += U * blockDim.x) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + u * blockDim.x + threadIdx.x;
            if (c < chunks) v[u] = s4[c];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = base + u * blockDim.x + threadIdx.x;
            if (c < chunks) d4[c] = v[u];
        }
    }
}
