//! CUDA graphs for the decoding steps: a plain decode step is ~250 launches, a verify as many,
//! a draft round ~70. Replaying a captured graph instead of launching them one by one from the
//! host takes the host's per-launch work off the path and lets the driver issue the kernels
//! back to back (measured on the H200 before this module: decode 4.70 → 4.60 ms at ctx 512).
//!
//! A graph bakes in every kernel argument, so whatever changes between steps must live in
//! device memory: the step's position and KV length (`StepLens`, written with the token ids in
//! one copy before the launch) and the token ids. What a graph cannot follow is its shape: the
//! number of rows, which rows get logits, and the attention grid, which is sized for a
//! power-of-two key capacity (`kv_cap`) — slices past the step's keys exit at once. Those form
//! the key of a graph; the first step with a new key captures it (nothing runs while capturing)
//! and then replays it.
//!
//! Graphs are skipped while the GPU is profiling (per-launch events cannot be replayed) and
//! when `DSPARK_NO_GRAPHS` is set (for A/B runs). The eager path runs the very same launch
//! sequence with `kv_cap = kv_len`, which gives the same slices, so both paths give the same
//! bits (the GPU model tests compare them).

use crate::cuda::layers::drv;
use crate::error::{Error, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use dspark_kernels::cuda::Gpu;
use std::collections::HashMap;
use std::hash::Hash;

/// Steps of more rows than this (prefill chunks) launch eagerly: each shape runs once or twice.
pub const MAX_GRAPH_ROWS: usize = 16;

/// Captured graphs beyond this many are dropped and captured again on demand (a long generation
/// meets a handful of keys; this only bounds pathological ones).
const MAX_GRAPHS: usize = 128;

/// The graphs of one model, by step shape.
pub struct StepGraphs<K> {
    graphs: HashMap<K, CudaGraph>,
    enabled: bool,
}

impl<K: Hash + Eq> StepGraphs<K> {
    pub fn new() -> StepGraphs<K> {
        StepGraphs { graphs: HashMap::new(), enabled: std::env::var_os("DSPARK_NO_GRAPHS").is_none() }
    }

    /// Turns graph capture on or off (off: every step launches eagerly).
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        self.graphs.clear();
    }

    /// Whether a step of `rows` rows runs through a graph on `gpu`.
    pub fn active(&self, gpu: &Gpu, rows: usize) -> bool {
        self.enabled && rows <= MAX_GRAPH_ROWS && !gpu.is_profiling()
    }

    /// Drops every graph (after a buffer a graph points at was replaced).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }

    /// The key capacity a step of `rows` rows and `kv_len` keys is launched for: the next power
    /// of two, at most the cache's `max_len` rows, when it runs through a graph; exactly `kv_len`
    /// otherwise.
    pub fn kv_cap(&self, gpu: &Gpu, rows: usize, kv_len: usize, max_len: usize) -> usize {
        if self.active(gpu, rows) {
            kv_len.next_power_of_two().min(max_len).max(kv_len)
        } else {
            kv_len
        }
    }

    /// Runs `work` (a step of `rows` rows: its launches, nothing else) on the GPU's stream:
    /// replays the graph captured for `key`, or captures `work` into one and launches it.
    pub fn run(&mut self, gpu: &Gpu, rows: usize, key: K, work: impl FnOnce() -> Result<()>) -> Result<()> {
        if !self.active(gpu, rows) {
            return work();
        }
        if let Some(g) = self.graphs.get(&key) {
            return g.launch().map_err(drv);
        }
        if self.graphs.len() >= MAX_GRAPHS {
            self.graphs.clear();
        }
        gpu.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(drv)?;
        let captured = work();
        // Capture must end even when a launch failed, or the stream stays unusable.
        let graph = gpu.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(drv);
        captured?;
        let graph = graph?.ok_or_else(|| Error::Request("CUDA graph capture recorded nothing".into()))?;
        graph.launch().map_err(drv)?;
        self.graphs.insert(key, graph);
        Ok(())
    }
}

/// An empty, disabled set (what `std::mem::take` leaves while a step borrows the model).
impl<K: Hash + Eq> Default for StepGraphs<K> {
    fn default() -> Self {
        StepGraphs { graphs: HashMap::new(), enabled: false }
    }
}
