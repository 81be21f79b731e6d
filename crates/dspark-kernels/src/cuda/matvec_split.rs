//! Launch side of the wide split kernels (kernels/matvec_split.cu): with bf16 activations, a
//! launch of 33–64 rows stages x once per block of 8 tiles instead of once per warp, each block
//! one part of the 8-row kernel's K split, the parts' partial sums added by the last block of a
//! tile group in the 8-row kernel's order — the same bits as the wide `_x1` / `_x1h` kernels of
//! matvec.cu they stand in for (`split_twin`), which stay the fallback (`Gpu::wide_split` off,
//! or no scratch reserved).

use super::matvec_pick::{tc_grid, TC_WARPS};
use super::pdl::Arg;
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// Partial sums a (tile, K part) entry holds at most: 64 rows × 16 outputs.
const ENTRY: usize = 64 * 16;

/// (tile, K part) entries the workspace holds: `matvec_pick.rs` `ksplit` doubles the split only while
/// tiles × split < 2048, so no shape with a split above 1 has more than 4096.
const ENTRIES: usize = 4096;

/// Tile groups (8 tiles) a launch with a split above 1 may have: fewer than 2048 tiles.
const TICKETS: usize = 256;

/// The split kernels' scratch: partial sums `[tile][part][row group][lane][4]` and one ticket a
/// tile group (zero between launches: the last block of a group resets its own).
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
/// of 128 outputs × (rows + 1) f32, whichever is larger (kernels/matvec_split.cu).
fn split_smem(rows: usize, bf16_rows: bool) -> usize {
    let (stages, bytes) = if bf16_rows { (4, 2) } else { (3, 4) };
    (stages * rows * 2 * 32 * bytes).max(128 * (rows + 1) * 4)
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

/// DSPARK_SPLIT_PROBE (a probe build, wrong results): 1 skips the epilogue, 2 the MMAs, 4 the x copies.
fn probe() -> i32 {
    std::env::var("DSPARK_SPLIT_PROBE").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

impl Gpu {
    /// Whether a wide launch of kernel `twin` over `d_out` × `d_in` goes to its split twin:
    /// asked for, scratch reserved, a twin exists, and its grid covers the SMs (one layer's k
    /// alone, 64 tiles at split 8, is 64 blocks: 15.7 → 22.0 µs at 64 rows on an H100).
    pub(crate) fn split_for(&self, twin: &str, d_out: usize, d_in: usize) -> Option<&'static str> {
        let tiles = d_out.div_ceil(16);
        let (ks, _) = tc_grid(tiles, d_in);
        let covers = self.split_any_grid || tiles.div_ceil(TC_WARPS) * ks >= self.sms;
        if self.wide_split && self.split_scratch.is_some() && covers {
            split_twin(twin)
        } else {
            None
        }
    }

    /// Launches split kernel `name` for one launch of `l.rows` (≤ `l.cap`) rows; the 8-row
    /// kernel's grid (the partial sums of squares a norm producer writes a row) is its `ogrid`.
    pub(crate) fn launch_split(&self, name: &str, l: &SplitLaunch) -> CudaResult<()> {
        let scratch = self
            .split_scratch
            .as_ref()
            .ok_or_else(|| CudaError::Shape(format!("{name}: the split kernels' scratch is not reserved")))?;
        let tiles = l.d_out.div_ceil(16);
        let (ks, ogrid) = tc_grid(tiles, l.d_in);
        let groups = tiles.div_ceil(TC_WARPS);
        if ks > 1 && (tiles * ks > ENTRIES || groups > TICKETS) {
            return Err(CudaError::Shape(format!(
                "{name}: {tiles} tiles at K split {ks} outgrow the split scratch ({ENTRIES} entries, {TICKETS} groups)"
            )));
        }
        if l.rows > l.cap || l.cap > 64 {
            return Err(CudaError::Shape(format!("{name}: {} rows in a launch of {}", l.rows, l.cap)));
        }
        let (ws, _g1) = scratch.ws.device_ptr(&self.stream);
        let (tickets, _g2) = scratch.tickets.device_ptr(&self.stream);
        // matvec_split_*(w, x, y, m, in, out, acc, ksplit, ss_in, parts, eps, gamma, xg, ss_out,
        // xg_bf16, ogrid, ws, tickets)
        let args = [
            l.w,
            l.x,
            l.y,
            Arg::I32(l.rows as i32),
            Arg::I32(l.d_in as i32),
            Arg::I32(l.d_out as i32),
            Arg::I32(l.accumulate as i32 | probe() << 4),
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
        let smem = split_smem(l.cap, name.contains("_x1h_")) as u32;
        self.launch_pdl_smem(name, ((groups * ks) as u32, 1, 1), 32 * TC_WARPS as u32, smem, &args)
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
                assert_eq!(split_smem_of(twin), Some(split_smem(64, x == "x1h")));
                // The 32-row launches stay on matvec.cu.
                assert_eq!(split_twin(&name.replace("_w8_", "_w4_")), None, "{name}");
            }
        }
        assert_eq!(split_twin("matvec_tc_w4_bf16"), None, "the f32-exact wide kernels have no split twin");
        assert_eq!(split_twin("matvec_tc_x1_bf16"), None, "8-row launches stay on matvec.cu");
    }

    #[test]
    fn the_scratch_holds_every_split_shape() {
        // The ksplit rule bounds tiles × split: try every tile count and a range of K.
        for tiles in 1..4096 {
            for d_in in [64, 136, 256, 1024, 4096, 12288, 20480] {
                let (ks, _) = tc_grid(tiles, d_in);
                if ks > 1 {
                    assert!(tiles * ks <= ENTRIES, "{tiles} tiles, K {d_in}: split {ks}");
                    assert!(tiles.div_ceil(TC_WARPS) <= TICKETS, "{tiles} tiles, K {d_in}");
                }
            }
        }
        // The largest ring and buffer stay under the 2-blocks-an-SM budget (228 KB an SM).
        assert!(split_smem(64, false) <= 64 * 1024 && split_smem(64, true) <= 64 * 1024);
    }
}
