//! Launch side of the wide split kernels (kernels/matvec_split.cu): with bf16 activations, a
//! launch of 17–64 rows stages x once per block of 8 tiles instead of once per warp, each block
//! one part of the 8-row kernel's K split, the parts one thread-block cluster whose blocks add
//! each other's partial sums in the 8-row kernel's order and share the epilogue — the same bits
//! as the wide `_x1` / `_x1h` kernels of matvec.cu they stand in for (`split_twin`), which stay
//! the fallback (`Gpu::wide_split` off, or the sm_80 PTX: no clusters).

use super::matvec_pick::{tc_grid, TC_WARPS};
use super::pdl::Arg;
use super::{CudaError, CudaResult, Gpu};

/// Blocks a thread-block cluster of the split kernels holds: a tile group's K-split parts
/// (8 / ksplit groups a cluster; SPLIT_CLUSTER in kernels/matvec_split.cu).
const CLUSTER: usize = 8;

/// The split twin of a 64- or 32-row `_x1` / `_x1h` kernel of matvec.cu (`matvec_pick.rs`
/// `wide_twin`): one kernel for the three 8-row shapes' twins (a part's chunk order does not
/// depend on the step length), and the SwiGLU one; `None` for every other kernel. The 32-row
/// twins only with `rows32` (`Gpu::split_rows32`).
pub(crate) fn split_twin(name: &str, rows32: bool) -> Option<&'static str> {
    Some(match name {
        "matvec_tc_x1_w8_bf16" | "matvec_tc_u4_x1_w8_bf16" => "matvec_split_x1_w8_bf16",
        "matvec_tc_swiglu_x1_w8_bf16" => "matvec_split_swiglu_x1_w8_bf16",
        "matvec_tc_x1h_w8_bf16" | "matvec_tc_u4_x1h_w8_bf16" => "matvec_split_x1h_w8_bf16",
        "matvec_tc_swiglu_x1h_w8_bf16" => "matvec_split_swiglu_x1h_w8_bf16",
        "matvec_tc_x1_w4_bf16" | "matvec_tc_u4_x1_w4_bf16" if rows32 => "matvec_split_x1_w4_bf16",
        "matvec_tc_swiglu_x1_w4_bf16" if rows32 => "matvec_split_swiglu_x1_w4_bf16",
        "matvec_tc_x1h_w4_bf16" | "matvec_tc_u4_x1h_w4_bf16" if rows32 => "matvec_split_x1h_w4_bf16",
        "matvec_tc_swiglu_x1h_w4_bf16" if rows32 => "matvec_split_swiglu_x1h_w4_bf16",
        _ => return None,
    })
}

/// Dynamic shared memory of a split kernel holding `rows` activation rows: its ring of x stages
/// (4 of bf16 rows, 3 of f32, 2 chunks of 32 k each) or, after the loop, the warps' partial
/// sums (8 tiles × rows × 16 f32) and the epilogue's buffer of up to 128 outputs × (rows + 1)
/// f32, whichever is larger (kernels/matvec_split.cu).
fn split_smem(rows: usize, bf16_rows: bool) -> usize {
    let (stages, bytes) = if bf16_rows { (4, 2) } else { (3, 4) };
    (stages * rows * 2 * 32 * bytes).max(TC_WARPS * rows * 16 * 4 + 128 * (rows + 1) * 4)
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
    Some(split_smem(rows, name.contains("_x1h_")))
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
    /// Whether a wide launch of kernel `twin` over `d_out` × `d_in` goes to its split twin:
    /// asked for, the sm_90 PTX loaded (thread-block clusters), a twin exists, and its grid
    /// covers the SMs (one layer's k alone, 64 tiles at split 8, is 64 blocks: 15.7 → 22.0 µs at
    /// 64 rows on an H100).
    pub(crate) fn split_for(&self, twin: &str, d_out: usize, d_in: usize) -> Option<&'static str> {
        let tiles = d_out.div_ceil(16);
        let (ks, _) = tc_grid(tiles, d_in);
        let covers = self.split_any_grid || tiles.div_ceil(TC_WARPS) * ks >= self.sms;
        if self.wide_split && self.clusters && covers {
            split_twin(twin, self.split_rows32)
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
        if !CLUSTER.is_multiple_of(ks) {
            return Err(CudaError::Shape(format!("{name}: K split {ks} does not divide a tile group")));
        }
        if l.rows > l.cap || l.cap > 64 {
            return Err(CudaError::Shape(format!("{name}: {} rows in a launch of {}", l.rows, l.cap)));
        }
        // matvec_split_*(w, x, y, m, in, out, acc, ksplit, ss_in, parts, eps, gamma, xg, ss_out,
        // xg_bf16, ogrid)
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
        ];
        let smem = split_smem(l.cap, name.contains("_x1h_")) as u32;
        // Whole clusters: the blocks past the last group only join the cluster's barriers.
        let blocks = (groups * ks).next_multiple_of(CLUSTER);
        self.launch_pdl_smem(name, (blocks as u32, 1, 1), 32 * TC_WARPS as u32, smem, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_64_and_32_row_x1_kernel_has_a_split_twin() {
        for x in ["x1", "x1h"] {
            for pre in ["", "u4_", "swiglu_"] {
                let name = format!("matvec_tc_{pre}{x}_w8_bf16");
                let twin = split_twin(&name, false).unwrap_or_else(|| panic!("{name}: no split twin"));
                assert!(twin.contains(&format!("_{x}_w8_")), "{name} → {twin}");
                assert_eq!(twin.contains("swiglu"), pre == "swiglu_", "{name} → {twin}");
                assert_eq!(split_smem_of(twin), Some(split_smem(64, x == "x1h")));
                // The 32-row launches: their own twins, only with `rows32`.
                let n32 = name.replace("_w8_", "_w4_");
                assert_eq!(split_twin(&n32, false), None, "{n32}");
                let t32 = split_twin(&n32, true).unwrap_or_else(|| panic!("{n32}: no split twin"));
                assert_eq!(t32, twin.replace("_w8_", "_w4_"));
                assert_eq!(split_smem_of(t32), Some(split_smem(32, x == "x1h")));
            }
        }
        for rows32 in [false, true] {
            assert_eq!(split_twin("matvec_tc_w4_bf16", rows32), None, "the f32-exact wide kernels have no split twin");
            assert_eq!(split_twin("matvec_tc_x1_bf16", rows32), None, "8-row launches stay on matvec.cu");
            assert_eq!(split_twin("matvec_tc_x1_w2_bf16", rows32), None, "16-row launches stay on matvec.cu");
        }
    }

    #[test]
    fn every_split_shape_fills_whole_tile_groups_and_fits_two_blocks_an_sm() {
        // A cluster holds whole tile groups: the K split divides 8 for every tile count and K.
        for tiles in 1..4096 {
            for d_in in [64, 136, 256, 1024, 4096, 12288, 20480] {
                let (ks, _) = tc_grid(tiles, d_in);
                assert_eq!(CLUSTER % ks, 0, "{tiles} tiles, K {d_in}: split {ks}");
            }
        }
        // The ring, or the partial sums and buffer, stay under 2 blocks an SM (228 KB an SM).
        assert!(split_smem(64, false) <= 100 * 1024 && split_smem(64, true) <= 100 * 1024);
    }
}
