// The in-graph timeline of a step, for `dspark bench --trace` (crates/dspark-kernels/src/cuda/trace.rs).
//
// Why: a decode step is ~220 launches chained by PDL inside a CUDA graph, and host events can
// bracket a launch only outside a graph, where each launch pays ~4 µs of host work the replay
// does not (docs/perf.md). What the replayed step spends per kernel is only visible from inside
// the kernels. Every kernel of a step calls pdl_trigger() near its start and pdl_wait() before it
// touches what its predecessor wrote (common.cuh), so those two calls are the hooks: in the
// trace build (`cargo xtask ptx --trace`, -DDSPARK_TRACE) thread 0 of each block reads the
// global nanosecond timer at both and writes one record a block:
//
//   grid    %gridid, one value per launch (a replayed graph's launches each get their own),
//   start   %globaltimer at pdl_trigger(): the block is resident,
//   ready   %globaltimer as pdl_wait() returns: the predecessor has finished and its writes are
//           visible (a launch without PDL starts after its predecessor, so its wait returns at
//           once and ready ≈ start),
//   shape   gridDim (blocks) and blockDim (threads), to match the record to the host's launch,
//   where   the block's linear index and its SM.
//
// The slot is taken by an atomicAdd issued at pdl_trigger() whose result is first needed at
// pdl_wait(), so the block does not wait on it while the predecessor drains. Its index and the
// start time live in shared memory between the two calls, with a key (grid id and block) that
// pdl_wait() checks, so a kernel that waits without having triggered takes a slot of its own
// there instead of trusting uninitialised shared memory, and a second wait records nothing.
// Slots past the ring's capacity are dropped (the host reports the count). The normal build
// compiles none of this: its PTX is the same with or without this file.
#pragma once
#include <stdint.h>

#ifdef DSPARK_TRACE
struct TraceRecord {
    unsigned long long grid, start, ready;
    unsigned grid_blocks, block_threads, block, sm;
    unsigned long long reserved;
};
// Set by the host (cuModuleGetGlobal) in every module; a null ring turns the hooks off.
extern "C" {
__device__ TraceRecord* dspark_trace_ring;
__device__ unsigned* dspark_trace_count;
__device__ unsigned dspark_trace_capacity;
}

__shared__ unsigned long long dspark_trace_t0, dspark_trace_key;
__shared__ unsigned dspark_trace_slot;

__device__ __forceinline__ unsigned long long trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned long long trace_grid() {
    unsigned long long g;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
    return g;
}
__device__ __forceinline__ bool trace_thread() { return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0; }
__device__ __forceinline__ unsigned trace_block() {
    return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
__device__ __forceinline__ unsigned long long trace_key() {
    return (trace_grid() * 0x9E3779B97F4A7C15ull) ^ ((unsigned long long)trace_block() << 1 | 1ull);
}

__device__ __forceinline__ void trace_start() {
    if (!trace_thread()) return;
    // The time first: the ring's pointer is a global load, and a block of the next launch may
    // read the timer while this one waits on it.
    const unsigned long long t0 = trace_now();
    if (dspark_trace_ring == nullptr) return;
    dspark_trace_t0 = t0;
    dspark_trace_slot = atomicAdd(dspark_trace_count, 1u);
    dspark_trace_key = trace_key();
}

__device__ __forceinline__ void trace_ready() {
    if (!trace_thread() || dspark_trace_ring == nullptr) return;
    const unsigned long long ready = trace_now();
    const unsigned long long key = trace_key();
    if (dspark_trace_key == (key ^ 2ull)) return;  // this block's record is written
    unsigned long long t0 = dspark_trace_t0;
    unsigned slot = dspark_trace_slot;
    if (dspark_trace_key != key) {
        t0 = ready;
        slot = atomicAdd(dspark_trace_count, 1u);
    }
    dspark_trace_key = key ^ 2ull;
    if (slot >= dspark_trace_capacity) return;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    TraceRecord r;
    r.grid = trace_grid();
    r.start = t0;
    r.ready = ready;
    r.grid_blocks = gridDim.x * gridDim.y * gridDim.z;
    r.block_threads = blockDim.x * blockDim.y * blockDim.z;
    r.block = trace_block();
    r.sm = sm;
    r.reserved = 0;
    dspark_trace_ring[slot] = r;
}
#else
__device__ __forceinline__ void trace_start() {}
__device__ __forceinline__ void trace_ready() {}
#endif
