//! Which tensor-core matvec kernel a launch takes (kernels/matvec.cu): the K split and grid of a
//! shape, the shape's kernel (one wave of blocks), and the twins a launch swaps in — FP8, one
//! n-tile, x split in the block, wide (16 / 32 / 64 rows), `_x1` / `_x1h` (bf16 activations),
//! tile-looping and argmax. Pure functions of names and shapes; `matvec.rs` launches.

/// Rows of x per tensor-core matvec launch (the n-tile width).
pub(crate) const TC_ROWS: usize = 8;

/// Warps sharing one 16-row tile's K in the tensor-core matvec: enough warps in flight
/// (≥ 2048, about 16 per SM) for few-tile shapes, no split where tiles alone give that, and
/// never so much that a warp has less than 4 chunks of 32 k.
pub(crate) fn ksplit(tiles: usize, d_in: usize, warps: usize) -> usize {
    let mut ks = 1;
    while ks < warps && tiles * ks < 2048 && d_in / (32 * ks * 2) >= 4 {
        ks *= 2;
    }
    ks
}

/// Warps per block of the tensor-core matvec kernels (TC_WARPS in kernels/matvec.cu).
pub(crate) const TC_WARPS: usize = 8;

/// The host's K split of a tensor-core matvec over `tiles` 16-row tiles of `d_in`, and its grid:
/// a block holds TC_WARPS / ksplit tiles. Every launch and every launch plan uses this one figure
/// (the argmax epilogue sizes its partials by the grid).
pub(crate) fn tc_grid(tiles: usize, d_in: usize) -> (usize, usize) {
    let ks = ksplit(tiles, d_in, TC_WARPS);
    (ks, tiles.div_ceil(TC_WARPS / ks))
}

/// Steps of 4 chunks of 32 k a warp of `matvec_tc_u4b1h_bf16` holds (HOLD in kernels/matvec.cu).
pub(crate) const HOLD_STEPS: usize = 4;

/// Whether a warp's whole K range at K split `ks` fits in `matvec_tc_u4b1h_bf16`'s registers.
pub(crate) fn holds(d_in: usize, ks: usize) -> bool {
    d_in <= HOLD_STEPS * 4 * 32 * ks
}

/// The tensor-core matvec kernel for a shape on a GPU of `sms` SMs (kernels/matvec.cu). What
/// matters most is that the grid fits in one wave: K split over all 8 warps (few, long tiles)
/// takes 4 chunks per step at 2 blocks per SM, or alone on its SM when there are no more blocks
/// than SMs — there with the warp's whole K range requested before the PDL wait where it fits
/// in registers (one layer's k or v: 1024 × 4096); everything else, and any grid above 2 blocks
/// per SM (q|k|v's 384 tiles), takes 2 chunks per step at 3 blocks per SM. Measured with
/// `dspark bench --matvec-variants`.
pub(crate) fn tc_kernel(tiles: usize, d_in: usize, sms: usize) -> &'static str {
    let (ks, blocks) = tc_grid(tiles, d_in);
    if ks == 8 && blocks <= sms && holds(d_in, ks) {
        "matvec_tc_u4b1h_bf16"
    } else if ks == 8 && blocks <= sms {
        "matvec_tc_u4b1_bf16"
    } else if ks == 8 && blocks <= 2 * sms {
        "matvec_tc_u4_bf16"
    } else {
        "matvec_tc_bf16"
    }
}

/// Whether a shape takes the tile-looping kernels (`matvec_tc_loop*`, kernels/matvec.cu): short
/// tiles (K at most 1024: 16 steps of a warp) and more of them than one wave of the one-tile
/// kernel's warps (3 blocks of 8 per SM), so that kernel would run them in several rounds of
/// blocks, each paying a first round trip and an epilogue for a few steps of loads. Markov W2
/// (9496 tiles of K 256) is the one such shape of Qwen3 + DSpark; lm_head's tiles are long enough
/// (K 4096) to reach the ceiling without it.
pub(crate) fn loop_fits(tiles: usize, d_in: usize, sms: usize) -> bool {
    d_in <= 1024 && tiles > 3 * TC_WARPS * sms
}

/// The tensor-core kernel of a product with no RMSNorm fold in its epilogue: the tile-looping
/// one where it fits, else [`tc_kernel`]'s.
pub(crate) fn tc_kernel_plain(tiles: usize, d_in: usize, sms: usize) -> &'static str {
    if loop_fits(tiles, d_in, sms) {
        "matvec_tc_loop_bf16"
    } else {
        tc_kernel(tiles, d_in, sms)
    }
}

/// The FP8 twin of a bf16 tensor-core kernel (kernels/matvec.cu `MATVEC_TC_FP8`): the same
/// shapes, the held-K one without its hold and no tile-looping twin (no FP8 matrix has short
/// tiles: lm_head and the draft stay bf16).
pub(crate) fn fp8_twin(name: &str) -> &'static str {
    match name {
        "matvec_tc_u4_bf16" => "matvec_tc_u4_fp8",
        "matvec_tc_u4b1_bf16" | "matvec_tc_u4b1h_bf16" => "matvec_tc_u4b1_fp8",
        "matvec_tc_swiglu_bf16" => "matvec_tc_swiglu_fp8",
        _ => "matvec_tc_fp8",
    }
}

/// The one-n-tile twin of an FP8 tensor-core kernel, for launches of at most four rows (decode):
/// kernels/matvec.cu lays x's (row, part) columns out so that such a launch needs one n-tile of
/// MMAs instead of two; a row's sums are the same bits in both.
pub(crate) fn fp8_n1_twin(name: &str) -> &str {
    match name {
        "matvec_tc_fp8" => "matvec_tc_n1_fp8",
        "matvec_tc_u4_fp8" => "matvec_tc_u4_n1_fp8",
        "matvec_tc_u4b1_fp8" => "matvec_tc_u4b1_n1_fp8",
        "matvec_tc_swiglu_fp8" => "matvec_tc_swiglu_n1_fp8",
        other => other,
    }
}

/// The one-row FP8 twin that splits x inside its own launch (`_n1x`, kernels/matvec.cu), for a
/// kernel name of the FP8 family; `None` for the others.
pub(crate) fn fp8_n1x_twin(name: &str) -> Option<&'static str> {
    match name {
        "matvec_tc_fp8" => Some("matvec_tc_n1x_fp8"),
        "matvec_tc_u4_fp8" => Some("matvec_tc_u4_n1x_fp8"),
        "matvec_tc_u4b1_fp8" => Some("matvec_tc_u4b1_n1x_fp8"),
        "matvec_tc_swiglu_fp8" => Some("matvec_tc_swiglu_n1x_fp8"),
        _ => None,
    }
}

/// The E4M3-activation twins of an 8-row FP8 kernel (experiment `DSPARK_FP8_A8=1`, fp8.cuh):
/// the twin that reads x quantized by `quant_x_e4m3`, and the one-row twin that quantizes it in
/// its own blocks (`_a8x`); `None` for the others.
pub(crate) fn fp8_a8_twins(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "matvec_tc_fp8" => Some(("matvec_tc_a8_fp8", "matvec_tc_a8x_fp8")),
        "matvec_tc_u4_fp8" => Some(("matvec_tc_u4_a8_fp8", "matvec_tc_u4_a8x_fp8")),
        "matvec_tc_u4b1_fp8" => Some(("matvec_tc_u4b1_a8_fp8", "matvec_tc_u4b1_a8x_fp8")),
        "matvec_tc_swiglu_fp8" => Some(("matvec_tc_swiglu_a8_fp8", "matvec_tc_swiglu_a8x_fp8")),
        _ => None,
    }
}

/// Bytes of shared memory an `_a8x` launch takes for one row of `d_in`: its E4M3 bytes and one
/// f32 scale per 128 values, rounded to 16.
pub(crate) fn a8x_smem(d_in: usize) -> usize {
    (d_in + 4 * d_in.div_ceil(128)).next_multiple_of(16)
}

/// The blocks per SM an `_n1x` kernel is built for (its `__launch_bounds__`, which the host's
/// one-wave grids assume: its shared copy of x must leave them resident); `None` for the others.
pub(crate) fn n1x_blocks_per_sm(name: &str) -> Option<u32> {
    match name {
        "matvec_tc_n1x_fp8" | "matvec_tc_swiglu_n1x_fp8" | "matvec_tc_a8x_fp8" | "matvec_tc_swiglu_a8x_fp8" => Some(3),
        "matvec_tc_u4_n1x_fp8" | "matvec_tc_u4_a8x_fp8" => Some(2),
        "matvec_tc_u4b1_n1x_fp8" | "matvec_tc_u4b1_a8x_fp8" => Some(1),
        _ => None,
    }
}

/// Bytes of shared memory an `_n1x` launch takes for one row of `d_in`: its hi and lo f16
/// planes and the row's scale, rounded to 16.
pub(crate) fn n1x_smem(d_in: usize) -> usize {
    (4 * d_in + 4).next_multiple_of(16)
}

/// The wide twin of an 8-row bf16 or FP8 kernel for `rows` rows still to launch: 64 rows a
/// launch (`_w8`, the `_x1` kernels only) past 32, 32 (`_w4`) past 16, 16 (`_w2`) past 8; `None`
/// for 8 or fewer, and for the kernels without one (argmax, tile-looping, FP8's one-n-tile
/// ones). The twins take their shape's K split and grid, so every row's sums are the 8-row
/// kernel's bit for bit (kernels/matvec.cu).
pub(crate) fn wide_twin(name: &str, rows: usize) -> Option<(&'static str, usize)> {
    if rows <= 8 {
        return None;
    }
    let [w2, w4, w8] = match name {
        "matvec_tc_bf16" => ["matvec_tc_w2_bf16", "matvec_tc_w4_bf16", ""],
        "matvec_tc_u4_bf16" | "matvec_tc_u4b1_bf16" | "matvec_tc_u4b1h_bf16" => {
            ["matvec_tc_u4_w2_bf16", "matvec_tc_u4_w4_bf16", ""]
        }
        "matvec_tc_swiglu_bf16" => ["matvec_tc_swiglu_w2_bf16", "matvec_tc_swiglu_w4_bf16", ""],
        "matvec_tc_fp8" => ["matvec_tc_w2_fp8", "matvec_tc_w4_fp8", ""],
        "matvec_tc_u4_fp8" | "matvec_tc_u4b1_fp8" => ["matvec_tc_u4_w2_fp8", "matvec_tc_u4_w4_fp8", ""],
        "matvec_tc_swiglu_fp8" => ["matvec_tc_swiglu_w2_fp8", "matvec_tc_swiglu_w4_fp8", ""],
        "matvec_tc_x1_bf16" => ["matvec_tc_x1_w2_bf16", "matvec_tc_x1_w4_bf16", "matvec_tc_x1_w8_bf16"],
        "matvec_tc_u4_x1_bf16" | "matvec_tc_u4b1_x1_bf16" | "matvec_tc_u4b1h_x1_bf16" => {
            ["matvec_tc_u4_x1_w2_bf16", "matvec_tc_u4_x1_w4_bf16", "matvec_tc_u4_x1_w8_bf16"]
        }
        "matvec_tc_swiglu_x1_bf16" => {
            ["matvec_tc_swiglu_x1_w2_bf16", "matvec_tc_swiglu_x1_w4_bf16", "matvec_tc_swiglu_x1_w8_bf16"]
        }
        "matvec_tc_x1h_bf16" => ["matvec_tc_x1h_w2_bf16", "matvec_tc_x1h_w4_bf16", "matvec_tc_x1h_w8_bf16"],
        "matvec_tc_u4_x1h_bf16" | "matvec_tc_u4b1_x1h_bf16" | "matvec_tc_u4b1h_x1h_bf16" => {
            ["matvec_tc_u4_x1h_w2_bf16", "matvec_tc_u4_x1h_w4_bf16", "matvec_tc_u4_x1h_w8_bf16"]
        }
        "matvec_tc_swiglu_x1h_bf16" => {
            ["matvec_tc_swiglu_x1h_w2_bf16", "matvec_tc_swiglu_x1h_w4_bf16", "matvec_tc_swiglu_x1h_w8_bf16"]
        }
        _ => return None,
    };
    Some(if rows > 32 && !w8.is_empty() {
        (w8, 64)
    } else if rows > 16 {
        (w4, 32)
    } else {
        (w2, 16)
    })
}

/// The `_x1` twin of a bf16 tensor-core kernel (x rounded to bf16, one MMA part;
/// `Gpu::activations`);
/// the others (FP8, argmax, tile-looping, wide twins) as they are.
pub(crate) fn x1_twin(name: &str) -> &str {
    match name {
        "matvec_tc_bf16" => "matvec_tc_x1_bf16",
        "matvec_tc_u4_bf16" => "matvec_tc_u4_x1_bf16",
        "matvec_tc_u4b1_bf16" => "matvec_tc_u4b1_x1_bf16",
        "matvec_tc_u4b1h_bf16" => "matvec_tc_u4b1h_x1_bf16",
        "matvec_tc_swiglu_bf16" => "matvec_tc_swiglu_x1_bf16",
        other => other,
    }
}

/// The `_x1h` twin of an 8-row `_x1` kernel: x read as the bf16 rows a norm producer stored
/// (`NormOut::bf16`, matvec.rs), the same sums bit for bit; `None` for the kernels without one.
pub(crate) fn x1h_twin(name: &str) -> Option<&'static str> {
    Some(match name {
        "matvec_tc_x1_bf16" => "matvec_tc_x1h_bf16",
        "matvec_tc_u4_x1_bf16" => "matvec_tc_u4_x1h_bf16",
        "matvec_tc_u4b1_x1_bf16" => "matvec_tc_u4b1_x1h_bf16",
        "matvec_tc_u4b1h_x1_bf16" => "matvec_tc_u4b1h_x1h_bf16",
        "matvec_tc_swiglu_x1_bf16" => "matvec_tc_swiglu_x1h_bf16",
        _ => return None,
    })
}

/// Whether `name` is one of the tile-looping kernels (grid of one wave, no K split, no norm fold).
pub(crate) fn looping(name: &str) -> bool {
    name.starts_with("matvec_tc_loop")
}

/// Blocks per SM of the tile-looping kernels (their `__launch_bounds__` in kernels/matvec.cu).
pub(crate) const LOOP_BLOCKS_PER_SM: usize = 2;

/// The K split and grid kernel `name` launches with: one wave of the tile-looping kernels (no
/// split), else [`tc_grid`].
pub(crate) fn tc_launch_grid(name: &str, tiles: usize, d_in: usize, sms: usize) -> (usize, usize) {
    if looping(name) {
        (1, tiles.div_ceil(TC_WARPS).min(LOOP_BLOCKS_PER_SM * sms))
    } else {
        tc_grid(tiles, d_in)
    }
}

/// The one-row argmax twin for a shape (`matvec_tc_argmax_bf16` or its tile-looping twin).
pub(crate) fn tc_argmax_kernel(tiles: usize, d_in: usize, sms: usize) -> &'static str {
    if loop_fits(tiles, d_in, sms) {
        "matvec_tc_loop_argmax_bf16"
    } else {
        "matvec_tc_argmax_bf16"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tc_kernel_follows_the_tile_count() {
        // An H200's 132 SMs.
        assert_eq!(tc_kernel(9496, 4096, 132), "matvec_tc_bf16"); // lm_head
        assert_eq!(tc_kernel(1536, 4096, 132), "matvec_tc_bf16"); // gate|up
        assert_eq!(tc_kernel(384, 4096, 132), "matvec_tc_bf16"); // q|k|v: 384 blocks
        assert_eq!(tc_kernel(256, 4096, 132), "matvec_tc_u4_bf16"); // o
        assert_eq!(tc_kernel(256, 12288, 132), "matvec_tc_u4_bf16"); // down
        assert_eq!(tc_kernel(128, 4096, 132), "matvec_tc_u4b1h_bf16"); // one layer's k|v (2048 rows)
        assert_eq!(tc_kernel(64, 4096, 132), "matvec_tc_u4b1h_bf16"); // k or v alone
        assert_eq!(tc_kernel(64, 8192, 132), "matvec_tc_u4b1_bf16"); // K too long to hold
        assert_eq!(tc_kernel(640, 4096, 132), "matvec_tc_bf16"); // the draft's five layers' k|v

        // A smaller GPU moves o to the 3-blocks-per-SM kernel.
        assert_eq!(tc_kernel(256, 4096, 100), "matvec_tc_bf16");
    }

    #[test]
    fn wide_twins_take_16_or_32_rows() {
        assert_eq!(wide_twin("matvec_tc_bf16", 8), None);
        assert_eq!(wide_twin("matvec_tc_bf16", 9), Some(("matvec_tc_w2_bf16", 16)));
        assert_eq!(wide_twin("matvec_tc_u4b1h_bf16", 17), Some(("matvec_tc_u4_w4_bf16", 32)));
        assert_eq!(wide_twin("matvec_tc_swiglu_bf16", 64), Some(("matvec_tc_swiglu_w4_bf16", 32)));
        // FP8: 16 or 32 rows (no 64-row twins: two n-tiles a group leave no registers for eight).
        assert_eq!(wide_twin("matvec_tc_fp8", 32), Some(("matvec_tc_w4_fp8", 32)));
        assert_eq!(wide_twin("matvec_tc_u4b1_fp8", 12), Some(("matvec_tc_u4_w2_fp8", 16)));
        assert_eq!(wide_twin("matvec_tc_swiglu_fp8", 64), Some(("matvec_tc_swiglu_w4_fp8", 32)));
        assert_eq!(wide_twin("matvec_tc_n1_fp8", 32), None);
        assert_eq!(wide_twin("matvec_tc_argmax_bf16", 32), None);
        // The one-part kernels also take 64 rows a launch.
        assert_eq!(wide_twin("matvec_tc_x1_bf16", 33), Some(("matvec_tc_x1_w8_bf16", 64)));
        assert_eq!(wide_twin("matvec_tc_u4b1h_x1_bf16", 64), Some(("matvec_tc_u4_x1_w8_bf16", 64)));
        assert_eq!(wide_twin("matvec_tc_swiglu_x1_bf16", 20), Some(("matvec_tc_swiglu_x1_w4_bf16", 32)));
        assert_eq!(x1_twin("matvec_tc_u4b1h_bf16"), "matvec_tc_u4b1h_x1_bf16");
        assert_eq!(x1_twin("matvec_tc_argmax_bf16"), "matvec_tc_argmax_bf16");
        // Every 8-row `_x1` kernel has an `_x1h` twin whose wide twins read bf16 rows too.
        for name in ["matvec_tc_x1_bf16", "matvec_tc_u4_x1_bf16", "matvec_tc_u4b1h_x1_bf16", "matvec_tc_swiglu_x1_bf16"]
        {
            let twin = x1h_twin(name).unwrap();
            assert!(twin.contains("_x1h_"), "{twin}");
            for rows in [9, 17, 33] {
                assert!(wide_twin(twin, rows).unwrap().0.contains("_x1h_"), "{twin} at {rows} rows");
            }
        }
        assert_eq!(x1h_twin("matvec_tc_argmax_bf16"), None);
        assert_eq!(x1h_twin("matvec_tc_bf16"), None);
        assert_eq!(x1_twin("matvec_tc_fp8"), "matvec_tc_fp8");
    }

    #[test]
    fn many_short_tiles_take_the_looping_kernel() {
        // Markov W2 (9496 tiles of K 256) on 132 SMs: more tiles than 3 · 8 · 132 warps.
        assert_eq!(tc_kernel_plain(9496, 256, 132), "matvec_tc_loop_bf16");
        assert_eq!(tc_argmax_kernel(9496, 256, 132), "matvec_tc_loop_argmax_bf16");
        assert_eq!(tc_launch_grid("matvec_tc_loop_bf16", 9496, 256, 132), (1, 264));
        assert_eq!(tc_launch_grid("matvec_tc_loop_argmax_bf16", 9496, 256, 132), (1, 264));
        // lm_head's long tiles, a product of few tiles, and one short of a wave keep their kernels.
        assert_eq!(tc_kernel_plain(9496, 4096, 132), "matvec_tc_bf16");
        assert_eq!(tc_argmax_kernel(9496, 4096, 132), "matvec_tc_argmax_bf16");
        assert_eq!(tc_kernel_plain(256, 256, 132), tc_kernel(256, 256, 132));
        assert_eq!(tc_kernel_plain(3168, 256, 132), "matvec_tc_bf16");
        assert_eq!(tc_launch_grid("matvec_tc_bf16", 9496, 256, 132), tc_grid(9496, 256));
        // Fewer tiles than blocks of a wave: one block per 8 tiles.
        assert_eq!(tc_launch_grid("matvec_tc_loop_bf16", 100, 256, 132), (1, 13));
    }

    #[test]
    fn ksplit_follows_the_tile_count() {
        // Qwen3-8B shapes: q|k|v (384 tiles) and o/down/fc (256) split 8 ways; gate|up (1536)
        // 2 ways; lm_head and Markov W2 (9496) not at all.
        assert_eq!(ksplit(384, 4096, 8), 8);
        assert_eq!(ksplit(256, 12288, 8), 8);
        assert_eq!(ksplit(1536, 4096, 8), 2);
        assert_eq!(ksplit(9496, 4096, 8), 1);
        assert_eq!(ksplit(9496, 256, 8), 1);
        // A narrow K never leaves a warp with fewer than 4 chunks of 32.
        assert_eq!(ksplit(2, 64, 8), 1);
        assert_eq!(ksplit(4, 512, 8), 4);
        assert_eq!(ksplit(4, 256, 8), 2);
        assert_eq!(ksplit(4, 4096, 4), 4);
        // The grid that goes with it: Markov W2 (the argmax epilogue's 1,187 partials), q|k|v.
        assert_eq!(tc_grid(9496, 256), (1, 1187));
        assert_eq!(tc_grid(384, 4096), (8, 384));
    }
}
