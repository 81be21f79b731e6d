//! Split-KV attention ("flash-decoding") for the few query rows of decode, verify and draft
//! steps: the plan of its key slices, and the launches of its kernels (kernels/attention.cu,
//! the four-query `attention_split_q1_*`; kernels/attention_tc.cu, the tensor-core
//! `attention_tc_*`) and of their combine, with the per-head `attention_f32` for other shapes.
//!
//! A step's keys are cut into 32-key tiles, and slice s of the launch takes tiles s, s + stride,
//! s + 2·stride, … in order, each block one KV head's query group over one slice, writing an
//! unnormalised partial (running max m, sum l, Σ p·v) per query; the combine merges the slices
//! in a fixed order: M = max m_s, L = Σ l_s·e^(m_s−M), out = Σ o_s·e^(m_s−M) / L. The stride
//! fills one wave of the kernel's resident blocks with one query group per KV head, and depends
//! on nothing else (`split_plan`), so a row's tiles — and its bits — are those of every other
//! step that holds it: the greedy lossless invariant and batched = solo rest on that
//! (`Gpu::row_exact` also puts one-row steps on the tensor-core kernel, so that decode rows
//! equal verify rows bit for bit).

use super::kv::KvView;
use super::ops::{cfg, check, dynamic_smem, launch, OpScratch, StepLens};
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

/// Most key slices of one split attention launch.
pub const MAX_SPLITS: usize = 128;

/// Keys of one tile of the split attentions (kernels/common.cuh `SPLIT_TILE`).
pub const SPLIT_TILE: usize = 32;

/// Key slices of a split attention launch: `(grid slices, stride)`. Slice s of a step takes the
/// 32-key tiles s, s + stride, s + 2·stride, … of its kv_len keys, and `min(stride, ⌈kv_len / 32⌉)`
/// slices run (`split_block_at`, common.cuh), so a short context gets one tile per block and a
/// long one as many slices as fill one wave of `slots` resident blocks with one query group per
/// KV head (`nkv` blocks a slice) — each block then walks several tiles. The stride depends on
/// the kernel (its `slots`), the model and the GPU only: never on kv_len or the row count, so a
/// query row's tiles, and the bits of its attention, are the same in every step that holds it
/// (a decode step, a verify step, a batched step's item, a graph's wider grid). The grid's
/// slices follow `kv_cap` only, as a captured graph needs. Measured on the H200 (git history of
/// docs/perf.md): one full wave beats both fixed 64- and 128-key slices, which left half the
/// SMs idle for part of the 2048–4096 range.
pub fn split_plan(kv_cap: usize, nkv: usize, slots: usize) -> (usize, usize) {
    let stride = (slots / nkv.max(1)).clamp(1, MAX_SPLITS);
    (kv_cap.div_ceil(SPLIT_TILE).clamp(1, stride), stride)
}

/// Most query rows the split attention takes (verify and draft blocks are ≤ 8; prefill uses the
/// per-head kernel).
pub const SPLIT_ROWS: usize = 16;

/// The kernel shape of a split attention launch of `rows` rows over KV heads of `g` query heads
/// each: (queries per block, blocks per SM). A block takes 4 queries (one per warp) when that is
/// the whole group (decode) and the GPU is not row-exact; more queries (verify, the draft block),
/// and every step of a row-exact GPU, go to the tensor-core kernel, 32 per block.
pub(crate) fn split_kernel(rows: usize, g: usize, row_exact: bool) -> (usize, usize) {
    if rows * g <= 4 && !row_exact {
        (4, 4)
    } else {
        (32, 2)
    }
}

/// (slice, row) pairs of the partials a split launch of `rows` rows writes at most, at any
/// context: [`split_plan`]'s slices at an unbounded `kv_cap` (each shorter context takes fewer)
/// times the rows.
pub fn split_partials(rows: usize, (nh, nkv): (usize, usize), sms: usize) -> usize {
    let g = nh / nkv.max(1);
    // The more of the two kernels the rows may take: a row-exact GPU runs a decode row on the
    // tensor-core kernel, others on the four-query one.
    let slices = |row_exact| split_plan(usize::MAX, nkv, split_kernel(rows, g, row_exact).1 * sms).0;
    slices(false).max(slices(true)) * rows
}

/// The element type of a K and V cache pair, which must agree.
fn same_kv(what: &str, k: &KvView<'_>, v: &KvView<'_>) -> CudaResult<super::kv::KvDtype> {
    if k.dtype() != v.dtype() {
        return Err(CudaError::Shape(format!("{what}: K cache is {}, V cache {}", k.dtype().name(), v.dtype().name())));
    }
    Ok(k.dtype())
}

/// Buffer lengths (q, k, v, out) of an attention call against its shape.
fn check_attention(
    (q, k, v, out): (usize, usize, usize, usize),
    rows: usize,
    kv_len: usize,
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
) -> CudaResult<()> {
    check("attention q", q, rows * n_heads * head_dim)?;
    check("attention k", k, kv_len * n_kv_heads * head_dim)?;
    check("attention v", v, kv_len * n_kv_heads * head_dim)?;
    check("attention out", out, rows * n_heads * head_dim)
}

impl Gpu {
    /// Attention of `rows` queries over the first `kv_len` cache rows (both from `lens`).
    /// `causal`: row r sits at `first_pos + r` and sees keys `0..=first_pos + r`; otherwise every
    /// key.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: &CudaView<f32>,
        k: &KvView<'_>,
        v: &KvView<'_>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        lens: &StepLens<'_>,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        causal: bool,
    ) -> CudaResult<()> {
        if head_dim % 32 != 0 || head_dim > 256 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(CudaError::Shape(format!(
                "attention: head_dim {head_dim} must be a multiple of 32 up to 256, heads {n_heads} a multiple of kv heads {n_kv_heads}"
            )));
        }
        let heads = (n_heads, n_kv_heads, head_dim);
        check_attention((q.len(), k.len(), v.len(), out.len()), rows, lens.kv_cap, heads)?;
        check("attention lens", lens.dev.len(), 2)?;
        let kv = same_kv("attention", k, v)?;
        let (nh, nkv, hd, c) = (n_heads as i32, n_kv_heads as i32, head_dim as i32, causal as i32);
        let name = format!("attention_f32{}", kv.kernel_suffix());
        let mut b = self.stream.launch_builder(self.function(&name)?);
        b.arg(q);
        match (k, v) {
            (KvView::F32(k), KvView::F32(v)) => b.arg(k).arg(v),
            (KvView::Bf16(k), KvView::Bf16(v)) => b.arg(k).arg(v),
            _ => unreachable!("same_kv checked the pair"),
        };
        b.arg(out).arg(&nh).arg(&nkv).arg(&hd).arg(&lens.dev).arg(&c);
        // SAFETY: matches attention_f32[_kvbf16](q, k, v, out, nh, nkv, hd, lens, causal).
        launch!(self, &name, b, cfg(rows * n_heads, 128));
        Ok(())
    }

    /// Whether [`Gpu::attention_split`] of `rows` rows takes the split-KV kernels (whose combine
    /// can write bf16 rows, `out_bf16`), not the per-head kernel.
    pub fn attention_splits(&self, rows: usize, (nh, nkv, hd): (usize, usize, usize), scratch: &OpScratch) -> bool {
        matches!(hd, 64 | 128)
            && nkv > 0
            && nh % nkv == 0
            && rows <= SPLIT_ROWS
            && scratch.holds(rows, (nh, nkv, hd), self.sms)
    }

    /// Attention of `rows` queries over the first `kv_len` cache rows (as [`Gpu::attention`]),
    /// on the split-KV kernel when the query group fits it ([`Gpu::attention_splits`]), else the
    /// per-head kernel. `out_bf16`: write `out` as bf16 rows for an `_x1h` consumer (the split
    /// kernels only).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_split(
        &self,
        q: &CudaView<f32>,
        k: &KvView<'_>,
        v: &KvView<'_>,
        (out, out_bf16): (&mut CudaViewMut<f32>, bool),
        rows: usize,
        lens: &StepLens<'_>,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        causal: bool,
        scratch: &mut OpScratch,
    ) -> CudaResult<()> {
        if !self.attention_splits(rows, (n_heads, n_kv_heads, head_dim), scratch) {
            if out_bf16 {
                return Err(CudaError::Shape(format!(
                    "attention_split: {rows} rows take the per-head kernel, which writes f32 rows only"
                )));
            }
            return self.attention(q, k, v, out, rows, lens, (n_heads, n_kv_heads, head_dim), causal);
        }
        let kv_cap = lens.kv_cap;
        check_attention((q.len(), k.len(), v.len(), out.len()), rows, kv_cap, (n_heads, n_kv_heads, head_dim))?;
        check("attention lens", lens.dev.len(), 2)?;
        let kv = same_kv("attention_split", k, v)?;
        if !k.aligned16(self) || !v.aligned16(self) {
            return Err(CudaError::Shape("attention_split: K/V cache views must be 16-byte aligned".into()));
        }
        // The kernel by split_kernel's rule; the decode kernel's combine is a twin launched with
        // PDL (kernels/attention.cu).
        let group_queries = rows * (n_heads / n_kv_heads);
        let (per_block, per_sm) = split_kernel(rows, n_heads / n_kv_heads, self.rows_exact());
        let (name, combine) = if per_block == 4 {
            (format!("attention_split_q1_hd{head_dim}_f32{}", kv.kernel_suffix()), "attention_combine_q1_f32")
        } else {
            (format!("{}_hd{head_dim}_f32{}", self.attention_tc_prefix(), kv.kernel_suffix()), "attention_combine_f32")
        };
        let groups = group_queries.div_ceil(per_block);
        let (splits, stride) = split_plan(kv_cap, n_kv_heads, per_sm * self.sms);
        let (r, nh, nkv, c) = (rows as i32, n_heads as i32, n_kv_heads as i32, causal as i32);
        // attention_split_q1 / attention_tc _hd*_f32(q, k, v, part_o, part_ml, rows, nh, nkv, lens,
        // causal, stride)
        let lens_dev = dptr(self, &lens.dev);
        let args = [
            dptr(self, q),
            k.arg(self),
            v.arg(self),
            dptr_mut(self, &mut scratch.attn_o),
            dptr_mut(self, &mut scratch.attn_ml),
            Arg::I32(r),
            Arg::I32(nh),
            Arg::I32(nkv),
            lens_dev,
            Arg::I32(c),
            Arg::I32(stride as i32),
        ];
        let grid = ((n_kv_heads * groups) as u32, splits as u32, 1);
        match dynamic_smem(&name) {
            Some(smem) => self.launch_pdl_smem(&name, grid, 256, smem as u32, &args)?,
            None => self.launch_pdl(&name, grid, 128, &args)?,
        }
        self.attention_combine(combine, scratch, (out, out_bf16), rows, n_heads, head_dim, lens, (SPLIT_TILE, splits))
    }

    /// The merge of a split attention's partials (`scratch`) into `out [rows, nh·hd]` (bf16 rows
    /// with `out_bf16`): kernel `name` (`attention_combine_f32`, or its PDL twin after the decode
    /// kernel).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_combine(
        &self,
        name: &str,
        scratch: &OpScratch,
        (out, out_bf16): (&mut CudaViewMut<f32>, bool),
        rows: usize,
        nh: usize,
        hd: usize,
        lens: &StepLens<'_>,
        (keys, splits): (usize, usize),
    ) -> CudaResult<()> {
        // attention_combine[_q1]_f32(part_o, part_ml, out, rows, nh, hd, lens, keys, max_splits,
        // out_bf16)
        let args = [
            dptr(self, &scratch.attn_o),
            dptr(self, &scratch.attn_ml),
            dptr_mut(self, out),
            Arg::I32(rows as i32),
            Arg::I32(nh as i32),
            Arg::I32(hd as i32),
            dptr(self, &lens.dev),
            Arg::I32(keys as i32),
            Arg::I32(splits as i32),
            Arg::I32(out_bf16 as i32),
        ];
        self.launch_pdl(name, ((rows * nh) as u32, 1, 1), 4 * hd as u32, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::{split_kernel, split_partials, split_plan, MAX_SPLITS, SPLIT_ROWS};
    use crate::cuda::ops::OpScratch;

    #[test]
    fn split_partials_bound_every_launch_and_size_the_scratch() {
        // Qwen3-8B (32 heads over 8) on an H200's 132 SMs: a decode row takes 66 slices on the
        // four-query kernel, a verify row 33 on the tensor-core one at any row count; sixteen rows
        // take the most, 528 (8.7 MB of partials), where MAX_SPLITS × SPLIT_ROWS is 2,048.
        assert_eq!(split_partials(1, (32, 8), 132), 66);
        assert_eq!(split_partials(8, (32, 8), 132), 264);
        assert_eq!(split_partials(16, (32, 8), 132), 528);
        assert_eq!(OpScratch::sizes((32, 8, 128), 132).0, 528 * 32 * 128);
        for sms in [1, 20, 46, 108, 132, 170, 1000] {
            for (nh, nkv) in [(1, 1), (4, 1), (4, 4), (8, 2), (14, 2), (16, 8), (32, 8), (64, 8), (40, 8), (32, 32)] {
                for hd in [64, 128] {
                    let (ao, aml, ..) = OpScratch::sizes((nh, nkv, hd), sms);
                    assert!(ao <= MAX_SPLITS * SPLIT_ROWS * nh * hd && aml == ao / hd * 2);
                    for rows in 1..=SPLIT_ROWS {
                        let pairs = split_partials(rows, (nh, nkv), sms);
                        assert!(ao >= pairs * nh * hd, "{nh}/{nkv} heads, {rows} rows, {sms} SMs");
                        // What the launch takes at any context, as attention_split plans it, on a
                        // GPU of either mode.
                        for row_exact in [false, true] {
                            let per_sm = split_kernel(rows, nh / nkv, row_exact).1;
                            for kv_cap in [1, 31, 512, 4096, 16_384, 1 << 20] {
                                assert!(split_plan(kv_cap, nkv, per_sm * sms).0 * rows <= pairs);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn split_plan_fills_one_wave_at_a_stride_fixed_by_the_gpu() {
        // An H200: 132 SMs; Qwen3-8B's 8 KV heads.
        let (q1, tc) = (4 * 132, 2 * 132);
        // Short contexts: one 32-key tile per block; the stride is one wave whatever the context.
        assert_eq!(split_plan(512, 8, tc), (16, 33));
        assert_eq!(split_plan(1, 8, q1), (1, 66));
        // Long contexts: as many slices as fill one wave, each every stride-th tile.
        assert_eq!(split_plan(4096, 8, tc), (33, 33));
        assert_eq!(split_plan(8192, 8, tc), (33, 33));
        assert_eq!(split_plan(8192, 8, q1), (66, 66));
        assert_eq!(split_plan(2048, 8, q1), (64, 66));
        // Never more slices than the scratch holds, never fewer than one.
        assert_eq!(split_plan(1 << 20, 1, 10_000), (128, 128));
        assert_eq!(split_plan(4096, 1000, 10), (1, 1));
        // The stride follows neither the context nor anything but the KV heads and slots.
        for kv_cap in [1, 33, 100, 4096, 1 << 20] {
            assert_eq!(split_plan(kv_cap, 8, tc).1, 33);
            assert!(split_plan(kv_cap, 8, tc).0 <= 33);
        }
    }
}
