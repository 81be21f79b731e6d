//! Launch side of the wide split kernels (kernels/matvec_split.cu): with bf16 activations, a
//! launch of 33–64 rows stages x once per block of 8 tiles instead of once per warp, each block
//! one part of the 8-row kernel's K split, the parts' partial sums added in the 8-row kernel's
//! order — the same bits as the wide `_x1` / `_x1h` kernels of matvec.cu they stand in for
//! (`split_twin`), which stay the fallback (`Gpu::wide_split` off). Two ways to add the parts:
//! as blocks of one thread-block cluster that read each other's shared memory and share the
//! epilogue (`_cl_`, sm_90), or through a workspace in global memory, the last block of a group
//! to arrive adding them and running the group's epilogue (the scratch `Gpu::set_activations`
//! reserves). [`Gpu::split_for`] takes the cluster kernels where their grid takes no more waves:
//! clusters pack into the GPCs less tightly than blocks (q, o, down: 256 blocks, 32 clusters,
//! one wave as blocks and two as clusters on an H100).

use super::matvec_pick::{tc_grid, TC_WARPS};
use super::pdl::Arg;
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// Blocks a thread-block cluster of the split kernels holds: a tile group's K-split parts
/// (8 / ksplit groups a cluster; SPLIT_CLUSTER in kernels/matvec_split.cu).
const CLUSTER: usize = 8;

/// Partial sums a (tile, K part) entry of the workspace holds at most: 64 rows × 16 outputs.
const ENTRY: usize = 64 * 16;

/// (tile, K part) entries the workspace holds: `matvec_pick.rs` `ksplit` doubles the split only
/// while tiles × split < 2048, so no shape with a split above 1 has more than 4096.
const ENTRIES: usize = 4096;

/// Tile groups (8 tiles) a launch with a split above 1 may have: fewer than 2048 tiles.
const TICKETS: usize = 256;

/// The workspace kernels' scratch: partial sums `[tile][part][row group][lane][4]` and one
/// ticket a tile group (zero between launches: the last block of a group resets its own).
pub(crate) struct SplitScratch {
    ws: CudaSlice<f32>,
    tickets: CudaSlice<u32>,
}

impl SplitScratch {
    pub(crate) fn new(stream: &Arc<CudaStream>) -> CudaResult<SplitScratch> {
        Ok(SplitScratch { ws: stream.alloc_zeros(ENTRIES * ENTRY)?, tickets: stream.alloc_zeros(TICKETS)? })
    }
}

/// The split twin of a 64-row `_x1` / `_x1h` kernel of matvec.cu (`matvec_pick.rs` `wide_twin`): one
/// kernel for the three 8-row shapes' twins (a part's chunk order does not depend on the step
/// length), and the SwiGLU one; `None` for every other kernel. At 32 rows the split twins lost
/// in the model (H100: 4 requests' full blocks +5%, 8 requests' budget +1%; docs/perf.md).
pub(crate) fn split_twin(name: &str) -> Option<&'static str> {
    Some(match name {
        "matvec_tc_x1_w8_bf16" | "matvec_tc_u4_x1_w8_bf16" => "matvec_split_x1_w8_bf16",
        "matvec_tc_swiglu_x1_w8_bf16" => "matvec_split_swiglu_x1_w8_bf16",
        "matvec_tc_x1h_w8_bf16" | "matvec_tc_u4_x1h_w8_bf16" => "matvec_split_x1h_w8_bf16",
        "matvec_tc_swiglu_x1h_w8_bf16" => "matvec_split_swiglu_x1h_w8_bf16",
        _ => return None,
    })
}

/// Dynamic shared memory of a split kernel holding `rows` activation rows: its ring of x stages
/// (4 of bf16 rows, 3 of f32, 2 chunks of 32 k each) or, after the loop, the epilogue's buffer
/// of up to 128 outputs × (rows + 1) f32 and, in the cluster kernels, the warps' partial sums
/// before it (8 tiles × rows × 16 f32), whichever is larger (kernels/matvec_split.cu).
fn split_smem(rows: usize, bf16_rows: bool, cluster: bool) -> usize {
    let (stages, bytes) = if bf16_rows { (4, 2) } else { (3, 4) };
    let partials = if cluster { TC_WARPS * rows * 16 * 4 } else { 0 };
    (stages * rows * 2 * 32 * bytes).max(partials + 128 * (rows + 1) * 4)
}

/// [`split_smem`] of a split kernel by name (its launch limit is raised to it at load).
pub(crate) fn split_smem_of(name: &str) -> Option<usize> {
    let rows = if name.contains("_w2_") {
        16
    } else if name.contains("_w4_") {
        32
    } else if name.contains("_w8_") {
        64
    } else {
        return None;
    };
    Some(split_smem(rows, name.contains("_x1h_"), is_cluster(name)))
}

fn is_cluster(name: &str) -> bool {
    name.starts_with("matvec_split_cl_")
}

/// The split twin of a 32-row `_x1` / `_x1h` kernel of matvec.cu (`Gpu::split_rows32`).
fn split_twin32(name: &str) -> Option<&'static str> {
    Some(match name {
        "matvec_tc_x1_w4_bf16" | "matvec_tc_u4_x1_w4_bf16" => "matvec_split_x1_w4_bf16",
        "matvec_tc_swiglu_x1_w4_bf16" => "matvec_split_swiglu_x1_w4_bf16",
        "matvec_tc_x1h_w4_bf16" | "matvec_tc_u4_x1h_w4_bf16" => "matvec_split_x1h_w4_bf16",
        "matvec_tc_swiglu_x1h_w4_bf16" => "matvec_split_swiglu_x1h_w4_bf16",
        _ => return None,
    })
}

/// The cluster form of a workspace split kernel.
fn cluster_twin(name: &str) -> Option<&'static str> {
    Some(match name {
        "matvec_split_x1_w8_bf16" => "matvec_split_cl_x1_w8_bf16",
        "matvec_split_swiglu_x1_w8_bf16" => "matvec_split_cl_swiglu_x1_w8_bf16",
        "matvec_split_x1h_w8_bf16" => "matvec_split_cl_x1h_w8_bf16",
        "matvec_split_swiglu_x1h_w8_bf16" => "matvec_split_cl_swiglu_x1h_w8_bf16",
        "matvec_split_x1_w4_bf16" => "matvec_split_cl_x1_w4_bf16",
        "matvec_split_swiglu_x1_w4_bf16" => "matvec_split_cl_swiglu_x1_w4_bf16",
        "matvec_split_x1h_w4_bf16" => "matvec_split_cl_x1h_w4_bf16",
        "matvec_split_swiglu_x1h_w4_bf16" => "matvec_split_cl_swiglu_x1h_w4_bf16",
        _ => return None,
    })
}

/// Clusters of the split kernels resident at once on `gpu` (0 without the sm_90 PTX): the
/// driver's count for the largest one, whose shared memory all four share.
pub(crate) fn max_clusters(gpu: &Gpu) -> CudaResult<usize> {
    if !gpu.clusters {
        return Ok(0);
    }
    let name = "matvec_split_cl_x1_w8_bf16";
    let (f, _) = gpu.kernel(name)?;
    // SAFETY: a zeroed config is valid; the fields the query reads are set below.
    let mut cfg: sys::CUlaunchConfig = unsafe { std::mem::zeroed() };
    cfg.gridDimX = (CLUSTER * 64) as u32;
    cfg.gridDimY = 1;
    cfg.gridDimZ = 1;
    cfg.blockDimX = (32 * TC_WARPS) as u32;
    cfg.blockDimY = 1;
    cfg.blockDimZ = 1;
    cfg.sharedMemBytes = split_smem(64, false, true) as u32;
    let mut n: std::ffi::c_int = 0;
    // SAFETY: `f` is a loaded kernel with its cluster size compiled in; `cfg` outlives the call.
    let r = unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f.cu_function(), &cfg) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaError::Shape(format!("{name}: cuOccupancyMaxActiveClusters failed: {r:?}")));
    }
    Ok(n.max(0) as usize)
}

/// One split launch's arguments beyond the kernel name: the pointers and sizes matvec.rs's
/// launch loop has already worked out for the wide kernel it replaces.
pub(crate) struct SplitLaunch {
    pub w: Arg,
    pub x: Arg,
    pub y: Arg,
    pub rows: usize,
    pub cap: usize,
    pub d_in: usize,
    pub d_out: usize,
    pub accumulate: bool,
    pub ss_in: Arg,
    pub parts: usize,
    pub eps: f32,
    pub gamma: Arg,
    pub xg: Arg,
    pub ss_out: Arg,
    pub xg_bf16: bool,
}

impl Gpu {
    /// Whether a wide launch of kernel `twin` over `d_out` × `d_in` goes to a split twin, and
    /// which: asked for, a twin exists, and its grid covers the SMs (one layer's k alone, 64
    /// tiles at split 8, is 64 blocks: 15.7 → 22.0 µs at 64 rows on an H100); the cluster form
    /// where the GPU runs clusters (with `split_wave_rule`, only where its clusters take no more
    /// waves than the blocks do, 2 an SM: faster alone, slower in the model), else the
    /// workspace form where its scratch is reserved.
    pub(crate) fn split_for(&self, twin: &str, d_out: usize, d_in: usize) -> Option<&'static str> {
        let tiles = d_out.div_ceil(16);
        let (ks, _) = tc_grid(tiles, d_in);
        let blocks = tiles.div_ceil(TC_WARPS) * ks;
        let covers = self.split_any_grid || blocks >= self.sms;
        let name = split_twin(twin)
            .or_else(|| split_twin32(twin).filter(|_| self.split_rows32))
            .filter(|_| self.wide_split && covers)?;
        let clusters = blocks.div_ceil(CLUSTER);
        let cluster_waves = clusters.div_ceil(self.split_max_clusters.max(1));
        let block_waves = blocks.div_ceil(2 * self.sms);
        let waves_ok = !self.split_wave_rule || cluster_waves <= block_waves;
        if self.split_clusters && self.split_max_clusters > 0 && waves_ok {
            cluster_twin(name)
        } else if self.split_scratch.is_some() {
            Some(name)
        } else {
            None
        }
    }

    /// Launches split kernel `name` for one launch of `l.rows` (≤ `l.cap`) rows; the 8-row
    /// kernel's grid (the partial sums of squares a norm producer writes a row) is its `ogrid`.
    pub(crate) fn launch_split(&self, name: &str, l: &SplitLaunch) -> CudaResult<()> {
        let tiles = l.d_out.div_ceil(16);
        let (ks, ogrid) = tc_grid(tiles, l.d_in);
        let groups = tiles.div_ceil(TC_WARPS);
        let cluster = is_cluster(name);
        if l.rows > l.cap || l.cap > 64 {
            return Err(CudaError::Shape(format!("{name}: {} rows in a launch of {}", l.rows, l.cap)));
        }
        let (blocks, ws, tickets) = if cluster {
            if !CLUSTER.is_multiple_of(ks) {
                return Err(CudaError::Shape(format!("{name}: K split {ks} does not divide a cluster")));
            }
            // Whole clusters: the blocks past the last group only join the cluster's barriers.
            ((groups * ks).next_multiple_of(CLUSTER), 0, 0)
        } else {
            let scratch = self
                .split_scratch
                .as_ref()
                .ok_or_else(|| CudaError::Shape(format!("{name}: the split kernels' scratch is not reserved")))?;
            if ks > 1 && (tiles * ks > ENTRIES || groups > TICKETS) {
                return Err(CudaError::Shape(format!(
                    "{name}: {tiles} tiles at K split {ks} outgrow the split scratch ({ENTRIES} entries, {TICKETS} groups)"
                )));
            }
            let (ws, _g1) = scratch.ws.device_ptr(&self.stream);
            let (tickets, _g2) = scratch.tickets.device_ptr(&self.stream);
            (groups * ks, ws, tickets)
        };
        // matvec_split_*(w, x, y, m, in, out, acc, ksplit, ss_in, parts, eps, gamma, xg, ss_out,
        // xg_bf16, ogrid, ws, tickets); the cluster kernels take no workspace.
        let args = [
            l.w,
            l.x,
            l.y,
            Arg::I32(l.rows as i32),
            Arg::I32(l.d_in as i32),
            Arg::I32(l.d_out as i32),
            Arg::I32(l.accumulate as i32),
            Arg::I32(ks as i32),
            l.ss_in,
            Arg::I32(l.parts as i32),
            Arg::F32(l.eps),
            l.gamma,
            l.xg,
            l.ss_out,
            Arg::I32(l.xg_bf16 as i32),
            Arg::I32(ogrid as i32),
            Arg::Ptr(ws),
            Arg::Ptr(tickets),
        ];
        let smem = split_smem(l.cap, name.contains("_x1h_"), cluster) as u32;
        self.launch_pdl_smem(name, (blocks as u32, 1, 1), 32 * TC_WARPS as u32, smem, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_64_row_x1_kernel_has_a_split_twin() {
        for x in ["x1", "x1h"] {
            for pre in ["", "u4_", "swiglu_"] {
                let name = format!("matvec_tc_{pre}{x}_w8_bf16");
                let twin = split_twin(&name).unwrap_or_else(|| panic!("{name}: no split twin"));
                assert!(twin.contains(&format!("_{x}_w8_")), "{name} → {twin}");
                assert_eq!(twin.contains("swiglu"), pre == "swiglu_", "{name} → {twin}");
                assert_eq!(split_smem_of(twin), Some(split_smem(64, x == "x1h", false)));
                let cl = cluster_twin(twin).unwrap_or_else(|| panic!("{twin}: no cluster form"));
                assert_eq!(cl.replace("_cl_", "_"), twin);
                assert_eq!(split_smem_of(cl), Some(split_smem(64, x == "x1h", true)));
                // The 32-row twins (`split_rows32`).
                let n32 = name.replace("_w8_", "_w4_");
                let t32 = split_twin32(&n32).unwrap_or_else(|| panic!("{n32}: no 32-row twin"));
                assert_eq!(t32, twin.replace("_w8_", "_w4_"));
                assert_eq!(cluster_twin(t32).map(|c| c.replace("_w4_", "_w8_")), Some(cl.to_string()));
                assert_eq!(split_smem_of(t32), Some(split_smem(32, x == "x1h", false)));
            }
        }
        assert_eq!(split_twin("matvec_tc_w4_bf16"), None, "the f32-exact wide kernels have no split twin");
        assert_eq!(split_twin("matvec_tc_x1_bf16"), None, "8-row launches stay on matvec.cu");
    }

    #[test]
    fn every_split_shape_fits_the_scratch_and_whole_clusters() {
        // The ksplit rule bounds tiles × split, and the split divides a cluster: try every tile
        // count and a range of K.
        for tiles in 1..4096 {
            for d_in in [64, 136, 256, 1024, 4096, 12288, 20480] {
                let (ks, _) = tc_grid(tiles, d_in);
                assert_eq!(CLUSTER % ks, 0, "{tiles} tiles, K {d_in}: split {ks}");
                if ks > 1 {
                    assert!(tiles * ks <= ENTRIES, "{tiles} tiles, K {d_in}: split {ks}");
                    assert!(tiles.div_ceil(TC_WARPS) <= TICKETS, "{tiles} tiles, K {d_in}");
                }
            }
        }
        // The ring, or the partial sums and buffer, stay under 2 blocks an SM (228 KB an SM).
        for (x1h, cl) in [(false, false), (true, false), (false, true), (true, true)] {
            assert!(split_smem(64, x1h, cl) <= 100 * 1024, "{x1h} {cl}");
        }
    }
}
