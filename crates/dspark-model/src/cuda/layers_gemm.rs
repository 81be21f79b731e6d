//! The layer step of the bf16-activation mode on cuBLASLt GEMMs (`dspark_kernels::cuda::row_gemm`):
//! the same layer as layers.rs, its four projections as GEMMs of one planned algorithm per shape.
//!
//! ```text
//! u = round(RMSNorm_in(x));  q|k|v = u · W_qkvᵀ                 (rmsnorm_to_bf16, GEMM)
//! q, k = RoPE(norm(q)), RoPE(norm(k)); K/V rows ← k, v; o = attention(q, cache)   (as layers.rs)
//! x += round(o) · W_oᵀ                                            (GEMM, beta = 1)
//! u = round(RMSNorm_post(x)); gu = u · W_gate|upᵀ                 (rmsnorm_to_bf16, GEMM)
//! x += round(silu(gate) ⊙ up) · W_downᵀ                           (swiglu_pairs_to_bf16, GEMM, beta = 1)
//! ```
//!
//! The mode rounds every projection's input to bf16 once; here each rounding is where its value
//! is made (the norm, the attention's combine, SwiGLU), the prefill's numerics (prefill.rs). Past
//! 8 rows a GEMM costs about what it costs at 8, where the matvec family grows with the rows
//! (docs/perf.md, issue #30). Every kernel here computes a row from that row alone, and the
//! GEMMs run one algorithm per shape at every row count, so a request's rows are the same bits
//! alone and batched (gpu_model `activations`): the lossless invariant of batched rounds.

use crate::checkpoint::config::Qwen3Config;
use crate::cuda::layers::{gpu_err, GpuLayer, Scratch, Segment};
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use dspark_kernels::cuda::gemm::Half;
use dspark_kernels::cuda::ops::WeightBuf;
use dspark_kernels::cuda::rope_fold::RopeWeights;
use dspark_kernels::cuda::Gpu;

/// The four projections of a layer as `(weight, k, n)`.
fn projections<'a>(cfg: &Qwen3Config, lw: &'a GpuLayer) -> [(&'a WeightBuf, usize, usize); 4] {
    let (h, q, kv, i) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
    [(&lw.qkv_proj, h, q + 2 * kv), (&lw.o_proj, q, h), (&lw.gate_up, h, 2 * i), (&lw.down_proj, i, h)]
}

/// Plans the row GEMMs of `layers`' shapes when the mode runs on them (`gpu.row_gemm`): each
/// shape's algorithm chosen on the first layer's weight. A shape that cannot be planned leaves
/// the layers on the matvec kernels, with a warning on stderr; the choice is the same for every
/// engine on this GPU and library, so rows stay the same bits alone and batched either way.
pub fn plan_row_gemms(gpu: &Gpu, cfg: &Qwen3Config, layers: &[GpuLayer]) {
    let (Some(rg), Some(first)) = (gpu.row_gemm.as_ref(), layers.first()) else { return };
    for (w, k, n) in projections(cfg, first) {
        if !matches!(w, WeightBuf::Bf16(_)) {
            return;
        }
        if let Err(e) = rg.plan(gpu, w, k, n) {
            eprintln!("warning: --activations bf16 keeps the matvec kernels for {n} × {k}: {e}");
            return;
        }
    }
}

/// Plans a head's row GEMM (lm_head: `n` = vocab rows of `k` = hidden), as [`plan_row_gemms`]
/// does a layer's; a head that cannot be planned stays on the matvec kernels.
pub fn plan_head(gpu: &Gpu, w: &WeightBuf, k: usize, n: usize) {
    let Some(rg) = gpu.row_gemm.as_ref() else { return };
    if matches!(w, WeightBuf::Bf16(_)) {
        if let Err(e) = rg.plan(gpu, w, k, n) {
            eprintln!("warning: --activations bf16 keeps the matvec kernels for the head ({n} × {k}): {e}");
        }
    }
}

/// `y = x · Wᵀ` for `m` f32 rows of `x` (a head: lm_head on normalised rows): on the row GEMM
/// where `w`'s shape is planned, x rounded to bf16 into `half` first (as the mode's matvec
/// rounds it), else the matvec. Both are row-exact, and which one runs depends only on the
/// shape, so a row's logits are the same bits alone and batched.
pub(crate) fn head_product(
    gpu: &Gpu,
    w: &WeightBuf,
    x: &CudaView<f32>,
    half: &mut CudaSlice<u16>,
    y: &mut CudaViewMut<f32>,
    (m, k, n): (usize, usize, usize),
) -> Result<()> {
    match gpu.row_gemm.as_deref() {
        Some(rg) if matches!(w, WeightBuf::Bf16(_)) && rg.planned(n, k) => {
            gpu.cast_to(Half::Bf16, x, &mut half.slice_mut(..m * k), m * k).map_err(gpu_err)?;
            gpu.row_gemm_bf16(rg, w, &half.slice(..m * k), y, (m, k, n), false).map_err(gpu_err)
        }
        _ => gpu.matvec(w, x, y, (m, k, n), false).map_err(gpu_err),
    }
}

/// Whether `layers` run on the row GEMMs: the mode's handle is there and every projection is
/// bf16 with its shape planned.
pub fn runs_on_row_gemms(gpu: &Gpu, cfg: &Qwen3Config, layers: &[GpuLayer]) -> bool {
    let Some(rg) = gpu.row_gemm.as_ref() else { return false };
    layers
        .iter()
        .all(|lw| projections(cfg, lw).iter().all(|(w, k, n)| matches!(w, WeightBuf::Bf16(_)) && rg.planned(*n, *k)))
}

/// `u = round(RMSNorm(x) · γ)` as bf16 rows in `s.half`, a GEMM's input.
fn norm_rows(
    gpu: &Gpu,
    x: &CudaViewMut<f32>,
    gamma: &CudaSlice<f32>,
    eps: f32,
    n: usize,
    s: &mut Scratch,
) -> Result<()> {
    let h = gamma.len();
    gpu.rmsnorm_to(Half::Bf16, &x.as_view(), &gamma.as_view(), eps, n, &mut s.half.slice_mut(..n * h)).map_err(gpu_err)
}

/// Runs one layer over `n` rows of `x` on the row GEMMs (module docs). `normed`: whether
/// `s.half` already holds this layer's input norm (the previous layer left it). Leaves the next
/// layer's input norm in `s.half` when `next_norm` is given, and returns whether it did.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_step_gemm(
    gpu: &Gpu,
    cfg: &Qwen3Config,
    lw: &GpuLayer,
    s: &mut Scratch,
    x: &mut CudaViewMut<f32>,
    (n, o_bf16): (usize, bool),
    inv_freq: &CudaSlice<f32>,
    (segments, l, seg): (&mut [Segment<'_>], usize, Option<&super::layers::Segmented>),
    causal: bool,
    (normed, next_norm): (bool, Option<&CudaSlice<f32>>),
) -> Result<bool> {
    let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
    let (q, kv, inter) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
    let heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let (e, qkv_dim) = (gpu_err, q + 2 * kv);
    let rg = gpu
        .row_gemm
        .as_deref()
        .ok_or_else(|| e(dspark_kernels::cuda::CudaError::Shape("no row GEMM handle".into())))?;
    if !normed {
        norm_rows(gpu, x, &lw.input_layernorm, eps, n, s)?;
    }
    gpu.row_gemm_bf16(
        rg,
        &lw.qkv_proj,
        &s.half.slice(..n * h),
        &mut s.qkv.slice_mut(..n * qkv_dim),
        (n, h, qkv_dim),
        false,
    )
    .map_err(e)?;
    let rope =
        RopeWeights { q_norm: &lw.q_norm.as_view(), k_norm: &lw.k_norm.as_view(), inv_freq: &inv_freq.as_view(), eps };
    super::layers::attend(gpu, s, (segments, l, seg), &rope, (n, o_bf16), heads, causal)?;
    // o_proj's input: the combine's bf16 rows where it stored them, else the f32 rows rounded.
    if !o_bf16 {
        gpu.cast_to(Half::Bf16, &s.o.slice(..n * q), &mut s.half.slice_mut(..n * q), n * q).map_err(e)?;
    }
    {
        // SAFETY: the combine stored n · q bf16 values from the start of `s.o` (its f32 values
        // hold two each), which this view reads as u16 bits.
        let o_rows = unsafe { s.o.transmute::<u16>(n * q) };
        let o_in = match (o_bf16, o_rows) {
            (true, Some(rows)) => rows,
            (true, None) => return Err(e(dspark_kernels::cuda::CudaError::Shape("o rows past the buffer".into()))),
            (false, _) => s.half.slice(..n * q),
        };
        gpu.row_gemm_bf16(rg, &lw.o_proj, &o_in, x, (n, q, h), true).map_err(e)?;
    }
    norm_rows(gpu, x, &lw.post_attention_layernorm, eps, n, s)?;
    gpu.row_gemm_bf16(
        rg,
        &lw.gate_up,
        &s.half.slice(..n * h),
        &mut s.gate_up.slice_mut(..n * 2 * inter),
        (n, h, 2 * inter),
        false,
    )
    .map_err(e)?;
    gpu.swiglu_pairs_to(Half::Bf16, &s.gate_up.slice(..n * 2 * inter), &mut s.half.slice_mut(..n * inter), inter, n)
        .map_err(e)?;
    gpu.row_gemm_bf16(rg, &lw.down_proj, &s.half.slice(..n * inter), x, (n, inter, h), true).map_err(e)?;
    match next_norm {
        Some(gamma) => {
            norm_rows(gpu, x, gamma, eps, n, s)?;
            Ok(true)
        }
        None => Ok(false),
    }
}
