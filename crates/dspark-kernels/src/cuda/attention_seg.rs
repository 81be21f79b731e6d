//! Segmented attention: one batched step's sequences in one launch per kernel (issue #30).
//!
//! A batched step (`dspark-model` `layers::Segment`) holds the verify rows of several requests,
//! each attending over its own caches. Launched one sequence at a time, each layer paid three
//! small launches per sequence — q|k|v norm + RoPE + append, the tensor-core split attention and
//! its combine — about 23 µs a sequence a layer at 512 keys, mostly latency: with 8 requests
//! that was a quarter of the target's forward. Here the three kernels run once a layer for every
//! sequence, `blockIdx.z` the sequence:
//!
//! ```text
//! table[layer][s] = {qkv rows, q rows, K cache, V cache, partials, out rows, lens, rows, splits}
//! qkv_rope_append_seg      grid (max rows · heads, 1, S)
//! attention_tc_seg_hd*     grid (nkv · max groups, max splits, S)
//! attention_combine_seg    grid (max rows · nh, 1, S)
//! ```
//!
//! A block past its sequence's rows, groups or slices leaves; every other block runs the same
//! body as the sequence's own launch with the same rows, caches, slice count and stride
//! (`split_plan` of its own `kv_cap`), so each sequence's outputs are those of its own
//! launches bit for bit — the per-request lossless invariant. Only sequences whose own launch
//! would take the tensor-core kernel (more than 4 queries per KV head, at most `SPLIT_ROWS`
//! rows; [`Gpu::segment_fits`]) go here; the caller launches the others alone.
//!
//! The table for every layer is written once per step ([`Gpu::plan_segments`], one copy beside
//! the step's other inputs), so no copy breaks the chain of launches between layers. Each
//! sequence's split partials get their own range of one buffer planned with the batch
//! ([`SegScratch`]); a step whose partials would not fit gets `None` and launches alone.

use super::attention_split::{split_plan, MAX_SPLITS, SPLIT_ROWS, SPLIT_TILE};
use super::kv::LayersKv;
use super::ops::{dynamic_smem, OpScratch, StepLens};
use super::pdl::{device_addr, Arg};
use super::rope_fold::RopeWeights;
use super::{CudaError, CudaResult, Gpu};
use crate::kv_dtype::KvDtype;
use cudarc::driver::{CudaSlice, CudaView};

/// 64-bit words of one table entry (`AttnSeg` in kernels/common.cuh).
pub const SEG_WORDS: usize = 9;
/// Queries per block of the tensor-core kernel (TC_Q in kernels/attention_tc.cu).
const TC_Q: usize = 32;
/// Resident tensor-core attention blocks per SM, as `attention_split` plans them.
const TC_PER_SM: usize = 2;

/// One sequence of a step: its rows `start .. start + rows`, its lengths, and its caches (every
/// layer's).
pub struct SegItem<'a, 'b> {
    pub start: usize,
    pub rows: usize,
    pub lens: &'b StepLens<'a>,
    pub caches: &'b LayersKv<'a>,
}

/// The buffers of segmented launches, planned with a batch: the table (`layers × max_segments`
/// entries) and the split partials of one step's sequences.
pub struct SegScratch {
    table: CudaSlice<u64>,
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    layers: usize,
    max_segments: usize,
    /// Where a planned step's entries for layer 0 start (set by `plan_segments`).
    words: Vec<u64>,
}

impl SegScratch {
    /// Element counts (table words, part_o, part_ml) for `layers` layers, up to `max_segments`
    /// sequences of `rows` rows in all, `nh × hd` query heads and `nkv` KV heads on `sms` SMs:
    /// the partials of the most slices a sequence can take on this GPU.
    pub fn sizes(
        layers: usize,
        max_segments: usize,
        rows: usize,
        (nh, nkv, hd): (usize, usize, usize),
        sms: usize,
    ) -> (usize, usize, usize) {
        let splits = (TC_PER_SM * sms / nkv.max(1)).clamp(1, MAX_SPLITS);
        (layers * max_segments * SEG_WORDS, splits * rows * nh * hd, splits * rows * nh * 2)
    }

    /// The scratch over buffers of [`SegScratch::sizes`] (from the caller's arena).
    pub fn new(
        table: CudaSlice<u64>,
        part_o: CudaSlice<f32>,
        part_ml: CudaSlice<f32>,
        layers: usize,
        max_segments: usize,
    ) -> SegScratch {
        SegScratch { table, part_o, part_ml, layers, max_segments, words: Vec::new() }
    }
}

/// A planned step: what each layer's launches need.
#[derive(Clone, Copy, Debug)]
pub struct SegPlan {
    segments: usize,
    max_rows: usize,
    max_groups: usize,
    max_splits: usize,
    /// The slices' tile stride, the same for every sequence (`split_plan`).
    stride: usize,
    /// The outputs as bf16 rows (for an `_x1h` consumer): a sequence's rows from `out`'s start
    /// at 2 bytes a value.
    out_bf16: bool,
    dtype: KvDtype,
}

fn shape(what: &str) -> CudaError {
    CudaError::Shape(format!("segmented attention: {what}"))
}

impl Gpu {
    /// Whether a sequence of `rows` rows attends, alone, through the tensor-core split kernel
    /// with a separate norm + RoPE + append (`rope_attention` → `attention_split`): those are
    /// the sequences a segmented launch may take.
    pub fn segment_fits(&self, rows: usize, (nh, nkv, hd): (usize, usize, usize), ops: &OpScratch) -> bool {
        matches!(hd, 64 | 128)
            && nkv > 0
            && nh % nkv == 0
            && rows > 0
            && rows <= SPLIT_ROWS
            && (rows * (nh / nkv) > 4 || self.rows_exact())
            && ops.holds(rows, (nh, nkv, hd), self.sms)
    }

    /// Writes the table of a step's sequences `items` (each [`Gpu::segment_fits`]) for every
    /// layer: their rows of `qkv` (`[n, (nh + 2·nkv)·hd]`), `q` and `out` (`[n, nh·hd]`), their
    /// caches and their partials. `None` when the partials do not fit the scratch (the caller
    /// then launches each sequence alone).
    #[allow(clippy::too_many_arguments)]
    pub fn plan_segments(
        &self,
        scratch: &mut SegScratch,
        items: &[SegItem<'_, '_>],
        layers: usize,
        qkv: &CudaView<f32>,
        q: &CudaView<f32>,
        (out, out_bf16): (&CudaView<f32>, bool),
        (nh, nkv, hd): (usize, usize, usize),
    ) -> CudaResult<Option<SegPlan>> {
        let s_count = items.len();
        if s_count == 0 || s_count > scratch.max_segments {
            return Err(shape(&format!("{s_count} sequences for a table of {}", scratch.max_segments)));
        }
        let qkv_dim = (nh + 2 * nkv) * hd;
        let n = items.iter().map(|it| it.start + it.rows).max().unwrap_or(0);
        if qkv.len() < n * qkv_dim || q.len() < n * nh * hd || out.len() < n * nh * hd {
            return Err(shape(&format!("activation buffers shorter than {n} rows")));
        }
        let f32_addr = |v: &CudaView<f32>, row: usize, width: usize| device_addr(self, v) + 4 * (row * width) as u64;
        // Each sequence's slice count and partial range, as its own launch would plan them.
        let mut plan = Vec::with_capacity(s_count);
        let (mut o_at, mut ml_at) = (0usize, 0usize);
        let (mut max_rows, mut max_groups, mut max_splits) = (0, 0, 0);
        let stride = split_plan(1, nkv, TC_PER_SM * self.sms).1;
        for it in items.iter() {
            let groups = (it.rows * (nh / nkv)).div_ceil(TC_Q);
            let (splits, _) = split_plan(it.lens.kv_cap, nkv, TC_PER_SM * self.sms);
            plan.push((splits, o_at, ml_at));
            o_at += splits * it.rows * nh * hd;
            ml_at += splits * it.rows * nh * 2;
            (max_rows, max_groups, max_splits) =
                (max_rows.max(it.rows), max_groups.max(groups), max_splits.max(splits));
        }
        if o_at > scratch.part_o.len() || ml_at > scratch.part_ml.len() {
            return Ok(None);
        }
        if layers > scratch.layers || items.iter().any(|it| it.caches.layers() < layers) {
            return Err(shape(&format!("{layers} layers of caches for a table of {}", scratch.layers)));
        }
        let dtype = items[0].caches.dtype();
        let (po, pml) = (device_addr(self, &scratch.part_o), device_addr(self, &scratch.part_ml));
        let words = &mut scratch.words;
        words.clear();
        for l in 0..layers {
            for (it, &(splits, o_off, ml_off)) in items.iter().zip(&plan) {
                let (ka, va, len) = it.caches.layer_addrs(self, l).ok_or_else(|| shape("a layer without caches"))?;
                let need = (it.lens.kv_cap.max(it.lens.first_pos + it.rows)) * nkv * hd;
                if len < need {
                    return Err(shape(&format!("layer {l}: caches of {len} values, {need} needed")));
                }
                if it.caches.dtype() != dtype {
                    return Err(shape("caches of different element types in one step"));
                }
                if ka % 16 != 0 || va % 16 != 0 {
                    return Err(shape("K/V caches must be 16-byte aligned"));
                }
                words.extend_from_slice(&[
                    f32_addr(qkv, it.start, qkv_dim),
                    f32_addr(q, it.start, nh * hd),
                    ka,
                    va,
                    po + 4 * o_off as u64,
                    pml + 4 * ml_off as u64,
                    match out_bf16 {
                        true => device_addr(self, out) + 2 * (it.start * nh * hd) as u64,
                        false => f32_addr(out, it.start, nh * hd),
                    },
                    device_addr(self, &it.lens.dev),
                    it.rows as u64 | (splits as u64) << 32,
                ]);
            }
        }
        self.stream.memcpy_htod(words.as_slice(), &mut scratch.table.slice_mut(..words.len()))?;
        Ok(Some(SegPlan { segments: s_count, max_rows, max_groups, max_splits, stride, out_bf16, dtype }))
    }

    /// Layer `layer`'s norm + RoPE + append, attention and combine for every sequence of
    /// `plan`, in three launches (see the module docs). `causal` as [`Gpu::attention_split`].
    pub fn rope_attention_segments(
        &self,
        plan: &SegPlan,
        scratch: &SegScratch,
        layer: usize,
        rope: &RopeWeights<'_>,
        (nh, nkv, hd): (usize, usize, usize),
        causal: bool,
    ) -> CudaResult<()> {
        if layer >= scratch.layers || (layer + 1) * plan.segments * SEG_WORDS > scratch.words.len() {
            return Err(shape(&format!("layer {layer} is not in the planned table")));
        }
        let table = Arg::Ptr(device_addr(self, &scratch.table) + 8 * (layer * plan.segments * SEG_WORDS) as u64);
        let sfx = plan.dtype.kernel_suffix();
        let z = plan.segments as u32;
        // qkv_rope_append_seg_f32*(segs, q_norm, k_norm, inv_freq, nq, nkv, hd, eps)
        let args = [
            table,
            super::pdl::dptr(self, rope.q_norm),
            super::pdl::dptr(self, rope.k_norm),
            super::pdl::dptr(self, rope.inv_freq),
            Arg::I32(nh as i32),
            Arg::I32(nkv as i32),
            Arg::I32(hd as i32),
            Arg::F32(rope.eps),
        ];
        let threads = (hd / 2).div_ceil(32) * 32;
        let rope_grid = ((plan.max_rows * (nh + 2 * nkv)) as u32, 1, z);
        self.launch_pdl(&format!("qkv_rope_append_seg_f32{sfx}"), rope_grid, threads as u32, &args)?;
        // attention_tc_seg_hd*_f32*(segs, nh, nkv, causal, stride)
        let name = format!("{}_seg_hd{hd}_f32{sfx}", self.attention_tc_prefix());
        let smem = dynamic_smem(&name).ok_or_else(|| shape(&format!("no kernel for head dim {hd}")))?;
        let stride = Arg::I32(plan.stride as i32);
        let args = [table, Arg::I32(nh as i32), Arg::I32(nkv as i32), Arg::I32(causal as i32), stride];
        let grid = ((nkv * plan.max_groups) as u32, plan.max_splits as u32, z);
        self.launch_pdl_smem(&name, grid, 256, smem as u32, &args)?;
        // attention_combine_seg_f32(segs, nh, hd, keys, out_bf16)
        let args = [
            table,
            Arg::I32(nh as i32),
            Arg::I32(hd as i32),
            Arg::I32(SPLIT_TILE as i32),
            Arg::I32(plan.out_bf16 as i32),
        ];
        self.launch_pdl("attention_combine_seg_f32", ((plan.max_rows * nh) as u32, 1, z), 4 * hd as u32, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partials_hold_the_most_slices_of_a_step() {
        // Qwen3-8B on an H200: 8 KV heads, 2 blocks per SM → at most 33 slices a sequence.
        let (words, o, ml) = SegScratch::sizes(36, 16, 64, (32, 8, 128), 132);
        assert_eq!(words, 36 * 16 * SEG_WORDS);
        assert_eq!(o, 33 * 64 * 32 * 128);
        assert_eq!(ml, 33 * 64 * 32 * 2);
        // Never more than the kernels' cap, never fewer than one.
        assert_eq!(SegScratch::sizes(1, 1, 8, (4, 1, 64), 10_000).1, MAX_SPLITS * 8 * 4 * 64);
        assert_eq!(SegScratch::sizes(1, 1, 8, (4, 4, 64), 1).1, 8 * 4 * 64);
    }
}
