//! A decode step's attention straight from the q|k|v projection output: the per-head norms,
//! RoPE, the cache append and the split-KV attention in one launch (plus the combine), where the
//! decode split kernel takes the step (kernels/norm_rope.cuh, the
//! `attention_split_rope_q1_*` kernels); otherwise `qkv_rope_append` and `attention_split` one
//! after the other. Both give the same bits (a GPU test compares them).
//!
//! Why: the append launch sits between q|k|v and the attention in every layer of every step,
//! and a launch costs ~1–2 µs in the graph on top of its work (docs/perf.md, the chain replica).
//! The folded kernel does its work inside the attention blocks: every block normalises and
//! rotates the queries it stages, and the block whose key slice holds the new row appends it.
//! Measured (git history of docs/perf.md): decode ±0 to −0.5% / −0.2% to −0.6% at 512 / 4096 keys. The same fold in
//! the tensor-core kernel (verify, draft block) was built and measured slower: its blocks stage
//! 32 queries each, and normalising and rotating them in every key slice cost more (+2 / +3.7
//! µs a launch at 512 / 4096 keys, kernel alone) than the append launch it saved, so the verify
//! took 1.5–1.9% longer. `DSPARK_NO_ROPE_FOLD=1` keeps the two launches (for A/B runs).

use super::attention_split::{split_plan, SPLIT_TILE};
use super::kv::{KvView, KvViewMut};
use super::ops::{check, OpScratch, StepLens};
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaView, CudaViewMut};

/// The per-head norm weights and RoPE frequencies of one attention layer.
pub struct RopeWeights<'a> {
    pub q_norm: &'a CudaView<'a, f32>,
    pub k_norm: &'a CudaView<'a, f32>,
    pub inv_freq: &'a CudaView<'a, f32>,
    pub eps: f32,
}

impl Gpu {
    /// Attention over layer caches `k_cache` / `v_cache` (whole, `lens.kv_cap` positions at
    /// least) for `rows` query rows at positions `lens.first_pos ..`, from the q|k|v projection
    /// output `qkv [rows, (nh + 2·nkv)·hd]`: q and k normalised and rotated, the rows' keys and
    /// values appended to the caches, the attention output written to `out [rows, nh·hd]` (bf16
    /// rows with `out_bf16`, where [`Gpu::attention_splits`] holds). `q_rot [rows, nh·hd]` is
    /// scratch for the unfolded path.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_attention(
        &self,
        qkv: &CudaView<f32>,
        rope: &RopeWeights<'_>,
        q_rot: &mut CudaViewMut<f32>,
        (k_cache, v_cache): (&mut KvViewMut<'_>, &mut KvViewMut<'_>),
        (out, out_bf16): (&mut CudaViewMut<f32>, bool),
        rows: usize,
        lens: &StepLens<'_>,
        (nh, nkv, hd): (usize, usize, usize),
        causal: bool,
        scratch: &mut OpScratch,
    ) -> CudaResult<()> {
        if !(self.rope_fold && !self.rows_exact() && folds(rows, (nh, nkv, hd), scratch, self.sms)) {
            let values = lens.kv_cap * nkv * hd;
            let (q_norm, k_norm, inv_freq, eps) = (rope.q_norm, rope.k_norm, rope.inv_freq, rope.eps);
            let heads = (rows, nh, nkv);
            self.qkv_rope_append(qkv, q_norm, k_norm, inv_freq, q_rot, k_cache, v_cache, heads, lens, eps)?;
            let (k_read, v_read) = (k_cache.view(values)?, v_cache.view(values)?);
            return self.attention_split(
                &q_rot.as_view(),
                &k_read,
                &v_read,
                (out, out_bf16),
                rows,
                lens,
                (nh, nkv, hd),
                causal,
                scratch,
            );
        }
        check("rope_attention qkv", qkv.len(), rows * (nh + 2 * nkv) * hd)?;
        check("rope_attention q_norm", rope.q_norm.len(), hd)?;
        check("rope_attention k_norm", rope.k_norm.len(), hd)?;
        check("rope_attention inv_freq", rope.inv_freq.len(), hd / 2)?;
        check("rope_attention out", out.len(), rows * nh * hd)?;
        check("rope_attention lens", lens.dev.len(), 2)?;
        let cap = lens.kv_cap.max(lens.first_pos + rows) * nkv * hd;
        check("rope_attention k_cache", k_cache.len(), cap)?;
        check("rope_attention v_cache", v_cache.len(), cap)?;
        if k_cache.dtype() != v_cache.dtype() {
            return Err(CudaError::Shape("rope_attention: K and V caches of different element types".into()));
        }
        if !k_cache.aligned16(self) || !v_cache.aligned16(self) {
            return Err(CudaError::Shape("rope_attention: K/V caches must be 16-byte aligned".into()));
        }
        let name = format!("attention_split_rope_q1_hd{hd}_f32{}", k_cache.dtype().kernel_suffix());
        // One block of four queries per KV head and key slice, four blocks per SM (ops.rs).
        let (splits, stride) = split_plan(lens.kv_cap, nkv, 4 * self.sms);
        let lens_dev = dptr(self, &lens.dev);
        // attention_split_rope_q1_*(qkv, q_norm, k_norm, inv_freq, k, v, part_o, part_ml, rows,
        // nh, nkv, lens, causal, stride, eps)
        let args = [
            dptr(self, qkv),
            dptr(self, rope.q_norm),
            dptr(self, rope.k_norm),
            dptr(self, rope.inv_freq),
            k_cache.arg(self),
            v_cache.arg(self),
            dptr_mut(self, &mut scratch.attn_o),
            dptr_mut(self, &mut scratch.attn_ml),
            Arg::I32(rows as i32),
            Arg::I32(nh as i32),
            Arg::I32(nkv as i32),
            lens_dev,
            Arg::I32(causal as i32),
            Arg::I32(stride as i32),
            Arg::F32(rope.eps),
        ];
        self.launch_pdl(&name, (nkv as u32, splits as u32, 1), 128, &args)?;
        let out = (out, out_bf16);
        self.attention_combine("attention_combine_q1_f32", scratch, out, rows, nh, hd, lens, (SPLIT_TILE, splits))
    }
}

/// Whether the folded kernel takes a step: while a KV head's queries fit its one block of four
/// (one row for Qwen3-8B, whose KV heads have four query heads), head dims 64 and 128.
fn folds(rows: usize, (nh, nkv, hd): (usize, usize, usize), scratch: &OpScratch, sms: usize) -> bool {
    matches!(hd, 64 | 128)
        && nkv > 0
        && nh % nkv == 0
        && rows > 0
        && rows * (nh / nkv) <= 4
        && scratch.holds(rows, (nh, nkv, hd), sms)
}

impl KvViewMut<'_> {
    /// The first `values` values, to read.
    pub fn view(&self, values: usize) -> CudaResult<KvView<'_>> {
        check("KV cache view", self.len(), values)?;
        Ok(match self {
            KvViewMut::F32(s) => KvView::F32(s.slice(..values)),
            KvViewMut::Bf16(s) => KvView::Bf16(s.slice(..values)),
        })
    }

    pub(crate) fn aligned16(&self, gpu: &Gpu) -> bool {
        match self {
            KvViewMut::F32(s) => super::ops::aligned16(gpu, &s.as_view()),
            KvViewMut::Bf16(s) => super::ops::aligned16(gpu, &s.as_view()),
        }
    }
}
