//! Decoder-layer weights and the layer step on the GPU, shared by the CUDA target and draft.
//!
//! One step over `n` rows at positions `first_pos ..`:
//!
//! ```text
//! u = RMSNorm_in(x);  q|k|v = W_qkv u                     (q_proj|k_proj|v_proj stacked: one matvec)
//! q, k = RoPE(norm(q)), RoPE(norm(k)); K/V cache rows [cache_row, cache_row + n) ← k, v   (one launch)
//! o = attention(q, cache rows [0, kv_len))                (causal for the target, not the draft)
//! x += Wo o                                               (matvec in accumulate mode)
//! u = RMSNorm_post(x);  x += down(silu(gate u) ⊙ up u)    (gate|up one matvec, SwiGLU in its epilogue)
//! ```
//!
//! On the tensor-core path the two RMSNorms fold into the matvecs around them
//! (`dspark_kernels::cuda::norm_fold`): `Wo` and `down` also leave `x·γ` and partial sums of
//! squares of the next norm, and q|k|v and gate|up scale their outputs by `1/rms`. Only the
//! first layer's input norm launches on its own, so a layer is 7 launches (9 without the fold).
//! Weights stay in the checkpoint dtype; every buffer comes from the arena at load.

use crate::checkpoint::config::Qwen3Config;
use crate::cuda::fp8::{plain_linears, RowOrder};
use crate::cuda::layers_gemm::{layer_step_gemm, runs_on_row_gemms};
use crate::cuda::weights::WeightSource;
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaViewMut};
use dspark_kernels::cuda::attention_seg::{SegItem, SegPlan, SegScratch};
use dspark_kernels::cuda::kv::{KvCaches, KvDtype, LayersKv};
use dspark_kernels::cuda::norm_fold::Normed;
use dspark_kernels::cuda::ops::{OpScratch, StepLens, WeightBuf};
use dspark_kernels::cuda::rope_fold::RopeWeights;
use dspark_kernels::cuda::{CudaError, Gpu};
use dspark_tensor::arena::Arena;

/// Converts CUDA errors into the model error type.
pub(crate) fn gpu_err(e: impl Into<CudaError>) -> Error {
    Error::Request(e.into().to_string())
}

pub(crate) fn drv(e: cudarc::driver::DriverError) -> Error {
    gpu_err(CudaError::Driver(e))
}

/// Zeroed K and V caches of `dtype` for `layers` layers, `len` values each, from the arena (the
/// target's at load, and the draft's, which take the target's element type).
pub(crate) fn kv_caches(arena: &Arena, dtype: KvDtype, layers: usize, len: usize) -> Result<KvCaches> {
    Ok(match dtype {
        KvDtype::F32 => {
            let make = || (0..layers).map(|_| arena.zeros::<f32>(len).map_err(drv)).collect::<Result<_>>();
            KvCaches::F32 { k: make()?, v: make()? }
        }
        KvDtype::Bf16 => {
            let make = || (0..layers).map(|_| arena.zeros::<u16>(len).map_err(drv)).collect::<Result<_>>();
            KvCaches::Bf16 { k: make()?, v: make()? }
        }
    })
}

/// One decoder layer on the device.
pub struct GpuLayer {
    pub input_layernorm: CudaSlice<f32>,
    /// `[q + 2·kv, H]`: q_proj rows, then k_proj, then v_proj.
    pub qkv_proj: WeightBuf,
    pub o_proj: WeightBuf,
    pub q_norm: CudaSlice<f32>,
    pub k_norm: CudaSlice<f32>,
    pub post_attention_layernorm: CudaSlice<f32>,
    /// `[2·I, H]`: gate_proj and up_proj rows interleaved (gate_0, up_0, gate_1, …).
    pub gate_up: WeightBuf,
    pub down_proj: WeightBuf,
}

impl GpuLayer {
    pub fn load(arena: &Arena, cfg: &Qwen3Config, ck: &dyn WeightSource, prefix: &str) -> Result<GpuLayer> {
        let (h, i, q, kv, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let n = |s: &str| format!("{prefix}{s}");
        let (qn, kn, vn) = (n("self_attn.q_proj"), n("self_attn.k_proj"), n("self_attn.v_proj"));
        let (on, gn, un, dn) = (n("self_attn.o_proj"), n("mlp.gate_proj"), n("mlp.up_proj"), n("mlp.down_proj"));
        // An FP8 target's projections keep their bytes and block scales (cuda::fp8); a plain
        // one's load in the checkpoint dtype.
        let linears = |modules: &[(&str, [usize; 2])], order: RowOrder| -> Result<WeightBuf> {
            match &cfg.quantization {
                Some(quant) => ck.fp8_linears(arena, quant, modules, order),
                None => plain_linears(ck, arena, modules, order),
            }
        };
        Ok(GpuLayer {
            input_layernorm: ck.vector(arena, &n("input_layernorm.weight"), &[h])?,
            qkv_proj: linears(&[(&qn, [q, h]), (&kn, [kv, h]), (&vn, [kv, h])], RowOrder::Stacked)?,
            o_proj: linears(&[(&on, [h, q])], RowOrder::Stacked)?,
            q_norm: ck.vector(arena, &n("self_attn.q_norm.weight"), &[hd])?,
            k_norm: ck.vector(arena, &n("self_attn.k_norm.weight"), &[hd])?,
            post_attention_layernorm: ck.vector(arena, &n("post_attention_layernorm.weight"), &[h])?,
            gate_up: linears(&[(&gn, [i, h]), (&un, [i, h])], RowOrder::Interleaved)?,
            down_proj: linears(&[(&dn, [h, i])], RowOrder::Stacked)?,
        })
    }
}

impl GpuLayer {
    /// Bytes of the layer's matrices (norm vectors are negligible and not counted).
    pub fn matrix_bytes(&self) -> usize {
        self.qkv_proj.bytes() + self.o_proj.bytes() + self.gate_up.bytes() + self.down_proj.bytes()
    }
}

/// Activation buffers for steps of up to `rows` rows.
pub struct Scratch {
    pub rows: usize,
    pub u: CudaSlice<f32>,
    /// `[rows, q + 2·kv]` output of the fused projection.
    pub qkv: CudaSlice<f32>,
    pub q: CudaSlice<f32>,
    pub o: CudaSlice<f32>,
    pub gate_up: CudaSlice<f32>,
    pub act: CudaSlice<f32>,
    /// `[rows, max(H, q, I)]` bf16 rows: a row GEMM's input (layers_gemm.rs).
    pub half: CudaSlice<u16>,
    /// `[rows, ⌈H/16⌉]`: partial sums of squares of a folded RMSNorm (at most one per 16 rows of
    /// the producer's output).
    pub ss: CudaSlice<f32>,
    pub ops: OpScratch,
    /// Buffers of segmented attention launches (a batched step's sequences in one launch per
    /// kernel), planned by [`Scratch::reserve_segments`] for models that run batched steps.
    pub seg: Option<SegScratch>,
}

impl Scratch {
    /// Buffers for steps of up to `rows` rows of `cfg`'s layers, the attention partials sized
    /// for a GPU of `sms` SMs.
    pub fn new(arena: &Arena, cfg: &Qwen3Config, rows: usize, sms: usize) -> Result<Scratch> {
        let z = |n: usize| arena.zeros::<f32>(rows * n).map_err(drv);
        let heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        let (ao, aml, am, at) = OpScratch::sizes(heads, sms);
        Ok(Scratch {
            rows,
            u: z(cfg.hidden_size)?,
            qkv: z(cfg.q_dim() + 2 * cfg.kv_dim())?,
            q: z(cfg.q_dim())?,
            o: z(cfg.q_dim())?,
            gate_up: z(2 * cfg.intermediate_size)?,
            act: z(cfg.intermediate_size)?,
            half: arena
                .zeros::<u16>(rows * cfg.hidden_size.max(cfg.q_dim()).max(cfg.intermediate_size))
                .map_err(drv)?,
            ss: z(cfg.hidden_size.div_ceil(16))?,
            ops: OpScratch {
                attn_o: arena.zeros(ao).map_err(drv)?,
                attn_ml: arena.zeros(aml).map_err(drv)?,
                argmax_v: arena.zeros(am).map_err(drv)?,
                argmax_i: arena.zeros(am).map_err(drv)?,
                argmax_tickets: arena.zeros(at).map_err(drv)?,
            },
            seg: None,
        })
    }

    /// Plans segmented attention for steps of up to `max_segments` sequences over `layers`
    /// layers (`dspark_kernels::cuda::attention_seg`): the table and the partials, from `arena`.
    pub fn reserve_segments(
        &mut self,
        arena: &Arena,
        gpu: &Gpu,
        cfg: &Qwen3Config,
        layers: usize,
        max_segments: usize,
    ) -> Result<()> {
        let heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        let (words, o, ml) = SegScratch::sizes(layers, max_segments, self.rows, heads, gpu.sms);
        let table = arena.zeros::<u64>(words).map_err(drv)?;
        let (part_o, part_ml) = (arena.zeros::<f32>(o).map_err(drv)?, arena.zeros::<f32>(ml).map_err(drv)?);
        self.seg = Some(SegScratch::new(table, part_o, part_ml, layers, max_segments));
        Ok(())
    }
}

/// Copies layer `l`'s output rows `x` (`[n, H]`) into every slot of the token-major capture
/// buffer `data` (`[rows, T·H]`, slot i = the i-th entry of `capture`) that taps layer `l`.
pub(crate) fn capture_layer(
    gpu: &Gpu,
    capture: &[usize],
    l: usize,
    x: &cudarc::driver::CudaView<f32>,
    (n, h): (usize, usize),
    data: &mut CudaSlice<f32>,
) -> Result<()> {
    let t = capture.len();
    for (slot, _) in capture.iter().enumerate().filter(|(_, &cl)| cl == l) {
        gpu.copy_rows(x, &mut data.slice_mut(slot * h..), n, h, (h, t * h)).map_err(gpu_err)?;
    }
    Ok(())
}

/// Where the rows of one sequence in a step attend: rows `start .. start + rows` of the step,
/// at that sequence's positions (`lens`), against its own K/V caches. A single-sequence step is
/// one segment of all its rows; a batched step (`cuda::qwen3::batch`) has one per request, and
/// every projection still runs once over all rows, so the weights are read once for all of them.
pub struct Segment<'a> {
    pub start: usize,
    pub rows: usize,
    pub lens: StepLens<'a>,
    pub caches: LayersKv<'a>,
}

/// Runs `layers` in order over `n` rows of `x` (`[n, H]`, updated in place), one
/// [`layer_step`] each with its own K/V cache. Each layer's `down` leaves the next layer's input
/// norm for it, and the last layer's leaves `final_norm` when one is given; `after(l, x)` runs
/// after layer `l` (the target copies its captures there). Returns what the last layer left in
/// `s.u` (`None` without `final_norm`).
#[allow(clippy::too_many_arguments)]
pub fn run_layers(
    gpu: &Gpu,
    cfg: &Qwen3Config,
    layers: &[GpuLayer],
    s: &mut Scratch,
    x: &mut CudaViewMut<f32>,
    (n, causal): (usize, bool),
    inv_freq: &CudaSlice<f32>,
    segments: &mut [Segment<'_>],
    final_norm: Option<&CudaSlice<f32>>,
    mut after: impl FnMut(usize, &CudaViewMut<f32>) -> Result<()>,
) -> Result<Option<Normed>> {
    let mut next = 0;
    for seg in segments.iter() {
        if seg.caches.layers() < layers.len() {
            return Err(gpu_err(CudaError::Shape(format!(
                "{} layers with K/V caches for {}",
                layers.len(),
                seg.caches.layers()
            ))));
        }
        if seg.start != next || seg.rows == 0 {
            return Err(gpu_err(CudaError::Shape(format!("segment at row {} of {} rows", seg.start, seg.rows))));
        }
        next += seg.rows;
    }
    if next != n {
        return Err(gpu_err(CudaError::Shape(format!("segments cover {next} of {n} rows"))));
    }
    // The attention's output as bf16 rows where o_proj reads them and every segment's attention
    // takes the split kernels (a prefill chunk's per-head kernel writes f32 rows).
    let heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let o_bf16 = layers.iter().all(|lw| gpu.reads_bf16_rows(&lw.o_proj, cfg.q_dim()))
        && segments.iter().all(|g| gpu.attention_splits(g.rows, heads, &s.ops));
    let seg = step_segments(gpu, cfg, s, segments, (n, o_bf16), layers.len())?;
    if runs_on_row_gemms(gpu, cfg, layers) {
        // Each layer leaves the next one's input norm in `s.half`; the last leaves the final
        // norm as f32 rows in `s.u` for the caller's head.
        let mut normed = false;
        for (l, lw) in layers.iter().enumerate() {
            let next = layers.get(l + 1).map(|next| &next.input_layernorm);
            let step = (&mut *segments, l, seg.as_ref());
            normed = layer_step_gemm(gpu, cfg, lw, s, x, (n, o_bf16), inv_freq, step, causal, (normed, next))?;
            after(l, x)?;
        }
        return match final_norm {
            Some(g) => {
                let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
                gpu.rmsnorm(&x.as_view(), &g.as_view(), eps, n, &mut s.u.slice_mut(..n * h)).map_err(gpu_err)?;
                Ok(Some(Normed::Done))
            }
            None => Ok(None),
        };
    }
    let mut normed = None;
    for (l, lw) in layers.iter().enumerate() {
        // The next layer's norm feeds its q|k|v, which may read bf16 rows; the final norm
        // feeds the caller's head, which reads f32 rows.
        let next_norm = match layers.get(l + 1) {
            Some(next) => Some((&next.input_layernorm, gpu.reads_bf16_rows(&next.qkv_proj, cfg.hidden_size))),
            None => final_norm.map(|g| (g, false)),
        };
        let step = (&mut *segments, l, seg.as_ref());
        normed = layer_step(gpu, cfg, lw, s, x, (n, o_bf16), inv_freq, step, causal, (normed, next_norm))?;
        after(l, x)?;
    }
    Ok(normed)
}

/// A step's segmented attention: which of its segments the launches take, and their plan.
pub(crate) type Segmented = (Vec<bool>, SegPlan);

/// The segmented attention of a step with several sequences (`attention_seg.rs`): which
/// segments it takes (those whose own launch is the tensor-core split kernel) and the planned
/// table, when at least two take it, the model planned the buffers and `Gpu::segmented` is on.
fn step_segments(
    gpu: &Gpu,
    cfg: &Qwen3Config,
    s: &mut Scratch,
    segments: &[Segment<'_>],
    (n, o_bf16): (usize, bool),
    layers: usize,
) -> Result<Option<Segmented>> {
    let heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let Scratch { seg, qkv, q, o, ops, .. } = s;
    let Some(seg) = seg.as_mut() else { return Ok(None) };
    if !gpu.segmented || segments.len() < 2 {
        return Ok(None);
    }
    let takes: Vec<bool> = segments.iter().map(|g| gpu.segment_fits(g.rows, heads, ops)).collect();
    let items: Vec<SegItem<'_, '_>> = segments
        .iter()
        .zip(&takes)
        .filter(|(_, &t)| t)
        .map(|(g, _)| SegItem { start: g.start, rows: g.rows, lens: &g.lens, caches: &g.caches })
        .collect();
    if items.len() < 2 {
        return Ok(None);
    }
    let (qkv_dim, qd) = (cfg.q_dim() + 2 * cfg.kv_dim(), cfg.q_dim());
    let plan = gpu
        .plan_segments(
            seg,
            &items,
            layers,
            &qkv.slice(..n * qkv_dim),
            &q.slice(..n * qd),
            (&o.slice(..n * qd), o_bf16),
            heads,
        )
        .map_err(gpu_err)?;
    Ok(plan.map(|p| (takes, p)))
}

/// Runs one layer over `n` rows of `x` (`[n, H]`, updated in place).
///
/// `input`: what `s.u` already holds — `None` when the step must normalise `x` itself (the first
/// layer), or what the previous step's `down` left ([`Normed`]). With `next_norm` the step's
/// `down` leaves the next RMSNorm (the next layer's `input_layernorm`, or the final norm) in
/// `s.u` / `s.ss` the same way, and returns what it left; its flag says whether the norm's
/// consumer is a bf16 projection, which may then read bf16 rows ([`Gpu::matvec_norm_out`]).
#[allow(clippy::too_many_arguments)]
fn layer_step(
    gpu: &Gpu,
    cfg: &Qwen3Config,
    lw: &GpuLayer,
    s: &mut Scratch,
    x: &mut CudaViewMut<f32>,
    (n, o_bf16): (usize, bool),
    inv_freq: &CudaSlice<f32>,
    (segments, l, seg): (&mut [Segment<'_>], usize, Option<&Segmented>),
    causal: bool,
    (input, next_norm): (Option<Normed>, Option<(&CudaSlice<f32>, bool)>),
) -> Result<Option<Normed>> {
    let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
    let (q, kv, inter) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
    let heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let e = gpu_err;
    let qkv_dim = q + 2 * kv;
    let input = match input {
        Some(normed) => normed,
        None => {
            gpu.rmsnorm(&x.as_view(), &lw.input_layernorm.as_view(), eps, n, &mut s.u.slice_mut(..n * h)).map_err(e)?;
            Normed::Done
        }
    };
    let ss_len = n * input.parts();
    gpu.matvec_normed(
        &lw.qkv_proj,
        &mut s.u.slice_mut(..n * h),
        input,
        &s.ss.slice(..ss_len),
        &mut s.qkv.slice_mut(..n * qkv_dim),
        (n, h, qkv_dim),
        false,
    )
    .map_err(e)?;
    let rope =
        RopeWeights { q_norm: &lw.q_norm.as_view(), k_norm: &lw.k_norm.as_view(), inv_freq: &inv_freq.as_view(), eps };
    attend(gpu, s, (segments, l, seg), &rope, (n, o_bf16), heads, causal)?;
    let post = gpu
        .matvec_norm_out(
            &lw.o_proj,
            (&s.o.slice(..n * q), o_bf16),
            x,
            (n, q, h),
            true,
            (&lw.post_attention_layernorm.as_view(), eps),
            &mut s.u.slice_mut(..n * h),
            &mut s.ss.slice_mut(..),
            gpu.reads_bf16_rows(&lw.gate_up, h),
        )
        .map_err(e)?;
    // act as bf16 rows where down reads them and folds the next norm (a step without one runs
    // the plain matvec, which reads f32).
    let act_bf16 = next_norm.is_some() && gpu.reads_bf16_rows(&lw.down_proj, inter);
    let act_bf16 = gpu
        .matvec_swiglu_normed(
            &lw.gate_up,
            &mut s.u.slice_mut(..n * h),
            post,
            &s.ss.slice(..n * post.parts()),
            &mut s.gate_up.slice_mut(..n * 2 * inter),
            &mut s.act.slice_mut(..n * inter),
            (n, h, inter),
            act_bf16,
        )
        .map_err(e)?;
    let act = s.act.slice(..n * inter);
    match next_norm {
        None => {
            gpu.matvec(&lw.down_proj, &act, x, (n, inter, h), true).map_err(e)?;
            Ok(None)
        }
        Some((gamma, bf16_rows)) => {
            let next = gpu
                .matvec_norm_out(
                    &lw.down_proj,
                    (&act, act_bf16),
                    x,
                    (n, inter, h),
                    true,
                    (&gamma.as_view(), eps),
                    &mut s.u.slice_mut(..n * h),
                    &mut s.ss.slice_mut(..),
                    bf16_rows,
                )
                .map_err(e)?;
            Ok(Some(next))
        }
    }
}

/// A layer's norms, RoPE, K/V append and attention over `n` rows of `s.qkv`, into `s.o` (bf16
/// rows packed from its start when `o_bf16`, else f32 rows): the segmented launches where the
/// step has them, each other segment's own launches.
pub(crate) fn attend(
    gpu: &Gpu,
    s: &mut Scratch,
    (segments, l, seg): (&mut [Segment<'_>], usize, Option<&Segmented>),
    rope: &RopeWeights<'_>,
    (n, o_bf16): (usize, bool),
    heads: (usize, usize, usize),
    causal: bool,
) -> Result<()> {
    let (q, qkv_dim) = (heads.0 * heads.2, heads.0 * heads.2 + 2 * heads.1 * heads.2);
    // Each sequence's rows attend over its own cache: those the segmented launch takes in one
    // launch per kernel, the rest in launches of their own (the kernels and their split are
    // chosen by the segment's rows, as when that sequence runs alone).
    let mut taken = &[][..];
    if let (Some((takes, plan)), Some(table)) = (seg, s.seg.as_ref()) {
        gpu.rope_attention_segments(plan, table, l, rope, heads, causal).map_err(gpu_err)?;
        taken = takes.as_slice();
    }
    for (i, seg) in segments.iter_mut().enumerate() {
        if taken.get(i).copied().unwrap_or(false) {
            continue;
        }
        let (r0, r1) = (seg.start, seg.start + seg.rows);
        let (mut k_app, mut v_app) = seg.caches.append_views(l);
        // bf16 rows are packed from the buffer's start: row r0 at value r0 · q of 2 bytes.
        let mut o_rows = if o_bf16 { s.o.slice_mut(r0 * q / 2..n * q) } else { s.o.slice_mut(r0 * q..r1 * q) };
        gpu.rope_attention(
            &s.qkv.slice(r0 * qkv_dim..r1 * qkv_dim),
            rope,
            &mut s.q.slice_mut(r0 * q..r1 * q),
            (&mut k_app, &mut v_app),
            (&mut o_rows, o_bf16),
            seg.rows,
            &seg.lens,
            heads,
            causal,
            &mut s.ops,
        )
        .map_err(gpu_err)?;
    }
    Ok(())
}
