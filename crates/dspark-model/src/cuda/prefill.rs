//! The prefill on the tensor cores: a forward of many rows (a prompt) as large GEMMs.
//!
//! Decode and verify steps are a few rows, where the small-M matvec streams each weight once at
//! the bandwidth floor (layers.rs). A prompt of thousands of rows is bound by arithmetic instead,
//! and the matvec's ~18 TFLOP/s made a 4,000-token prompt take 3.6 s. So a forward of more than
//! [`super::qwen3::CHUNK`] rows runs here, in chunks of up to [`Prefill::rows`] rows, each layer
//! as
//!
//! ```text
//! u = round(RMSNorm_in(x));   qkv = u · W_qkvᵀ                  (cuBLAS GEMM, f32 out)
//! q, k = RoPE(norm(q)), RoPE(norm(k)); K/V cache rows ← k, v      (qkv_rope_append, as decode)
//! o = causal attention(q, cache rows [0, first_pos + n))
//! x += round(o) · W_oᵀ                                             (GEMM, beta = 1: the residual add)
//! u = round(RMSNorm_post(x)); gu = u · W_gate|upᵀ                  (GEMM)
//! x += round(silu(gate) ⊙ up) · W_downᵀ                            (SwiGLU kernel, then GEMM, beta = 1)
//! ```
//!
//! `round` puts a GEMM's input in its weight's dtype (bf16 for published checkpoints; nothing for
//! f32 weights), the one place this path differs from the f32-exact small-M path (see
//! kernels/prefill.cu). Plain and speculative decoding share the prefill, so the lossless
//! invariant is untouched; `PrefillMode::Exact` keeps the small-M path for prompts too.
//! Every buffer is planned at load from the arena for `rows` rows.

use crate::checkpoint::config::Qwen3Config;
use crate::cuda::handoff::{Handoff, SharedCapture};
use crate::cuda::layers::{capture_layer, drv, gpu_err, GpuLayer};
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use dspark_kernels::cuda::gemm::{dequant_scratch, workspace_bytes, Blas, GemmIn, Half};
use dspark_kernels::cuda::kv::LayersKv;
use dspark_kernels::cuda::kv_layers::KvRowsLayout;
use dspark_kernels::cuda::ops::{StepLens, WeightBuf};
use dspark_kernels::cuda::Gpu;
use dspark_tensor::arena::Arena;
use std::sync::{Arc, Mutex, MutexGuard};

/// How a forward of more than a decode chunk's rows runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PrefillMode {
    /// GEMMs on the tensor cores, inputs rounded to the weights' dtype (the default).
    #[default]
    Gemm,
    /// The small-M matvec path in 64-row chunks: f32-exact activations, ~30× slower.
    Exact,
}

/// Most rows of one prefill chunk: 2,048 rows make every Qwen3-8B projection a GEMM of at least
/// 2048 × 4096 × 4096 (~70 GFLOP), past where cuBLAS reaches its plateau, and cost ~0.4 GB of
/// buffers.
pub const MAX_PREFILL_ROWS: usize = 2048;

/// The prefill's cuBLAS handle and activation buffers for chunks of up to `rows` rows.
pub struct Prefill {
    pub rows: usize,
    blas: Arc<Blas>,
    /// `[rows, H]` residual stream.
    pub x: CudaSlice<f32>,
    /// GEMM inputs of 16-bit weights: `[rows, max(H, q, I)]`.
    half_in: CudaSlice<u16>,
    /// GEMM inputs of f32 weights: `[rows, max(H, I)]` (empty when no weight is f32).
    f32_in: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    q: CudaSlice<f32>,
    o: CudaSlice<f32>,
    gate_up: CudaSlice<f32>,
    /// `[rows, T·H]` captured layer outputs of the chunk (planned when a draft attaches), a
    /// buffer the draft reads its context rows from (generation: prefill chunks).
    pub captured: SharedCapture,
}

impl Prefill {
    /// Plans a prefill of chunks of up to `rows` rows for `layers` (whose weight dtypes decide
    /// which input buffers exist).
    pub fn new(gpu: &Gpu, arena: &Arena, cfg: &Qwen3Config, layers: &[GpuLayer], rows: usize) -> Result<Prefill> {
        let (h, q, kv, i) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        let mats = layers.iter().flat_map(|l| [&l.qkv_proj, &l.o_proj, &l.gate_up, &l.down_proj]);
        let (mut any_half, mut any_f32) = (false, false);
        for w in mats {
            match Half::of(w) {
                Some(_) => any_half = true,
                None => any_f32 = true,
            }
        }
        let z = |n: usize| arena.zeros::<f32>(rows * n).map_err(drv);
        let mut blas = Blas::new(gpu, arena.zeros::<u8>(workspace_bytes(rows)).map_err(drv)?).map_err(gpu_err)?;
        // FP8 projections are widened to bf16 before each GEMM (gemm.rs): one scratch matrix as
        // large as the largest of them, or `dequant_scratch` values, larger ones going in tiles.
        let fp8_max = layers
            .iter()
            .flat_map(|l| [&l.qkv_proj, &l.o_proj, &l.gate_up, &l.down_proj])
            .filter(|w| matches!(w, WeightBuf::Fp8(_)))
            .map(|w| w.len())
            .max();
        if let Some(n) = fp8_max {
            blas = blas.with_dequant(arena.zeros::<u16>(dequant_scratch(rows, n)).map_err(drv)?);
        }
        let blas = Arc::new(blas);
        Ok(Prefill {
            rows,
            blas,
            x: z(h)?,
            half_in: arena.zeros::<u16>(if any_half { rows * h.max(q).max(i) } else { 1 }).map_err(drv)?,
            f32_in: if any_f32 { z(h.max(i))? } else { arena.zeros::<f32>(1).map_err(drv)? },
            qkv: z(q + 2 * kv)?,
            q: z(q)?,
            o: z(q)?,
            gate_up: z(2 * i)?,
            captured: Arc::new(Mutex::new(Handoff { data: arena.zeros::<f32>(1).map_err(drv)?, generation: 0 })),
        })
    }

    /// Runs layer `lw`'s four GEMMs at a few chunk sizes on the (scratch) buffers, so cuBLAS
    /// picks and loads its kernels at load time rather than inside a user's first prefill
    /// (measured: the first prefill of a fresh process took ~60 ms longer without it).
    pub fn warm_up(&mut self, gpu: &Gpu, cfg: &Qwen3Config, lw: &GpuLayer) -> Result<()> {
        let (h, q, kv, i) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        let e = gpu_err;
        for m in [self.rows, self.rows.div_ceil(2), self.rows.min(128)] {
            let gemms: [(&WeightBuf, usize, usize, &mut CudaSlice<f32>); 4] = [
                (&lw.qkv_proj, h, q + 2 * kv, &mut self.qkv),
                (&lw.o_proj, q, h, &mut self.o),
                (&lw.gate_up, h, 2 * i, &mut self.gate_up),
                (&lw.down_proj, i, h, &mut self.x),
            ];
            for (w, k, n, y) in gemms {
                let x = match Half::of(w) {
                    Some(_) => GemmIn::Half(self.half_in.slice(..m * k)),
                    None if self.f32_in.len() >= m * k => GemmIn::F32(self.f32_in.slice(..m * k)),
                    None => continue,
                };
                gpu.gemm(&self.blas, w, &x, &mut y.slice_mut(..m * n), (m, k, n), false).map_err(e)?;
            }
        }
        Ok(())
    }

    /// The cuBLAS handle, shared with a draft loaded for the same target.
    pub fn blas(&self) -> Arc<Blas> {
        self.blas.clone()
    }

    /// Plans the capture buffer for `slots` captured layers.
    pub fn plan_capture(&mut self, arena: &Arena, cfg: &Qwen3Config, slots: usize) -> Result<()> {
        let need = self.rows * slots * cfg.hidden_size;
        let mut cap = lock(&self.captured)?;
        if cap.data.len() < need {
            cap.data = arena.zeros::<f32>(need).map_err(drv)?;
        }
        Ok(())
    }

    /// Runs every layer over the chunk's `n` rows in `self.x` (embedded by the caller), appending
    /// their keys and values to `caches` at `lens.first_pos ..`; `capture[slot] = l` copies layer
    /// `l`'s output rows into slot `slot` of `self.captured`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_layers(
        &mut self,
        gpu: &Gpu,
        cfg: &Qwen3Config,
        layers: &[GpuLayer],
        n: usize,
        lens: &StepLens<'_>,
        inv_freq: &CudaSlice<f32>,
        mut caches: LayersKv<'_>,
        capture: &[usize],
    ) -> Result<()> {
        let h = cfg.hidden_size;
        let shared = self.captured.clone();
        let mut cap = lock(&shared)?;
        cap.generation += 1;
        for (l, lw) in layers.iter().enumerate() {
            self.layer_step(gpu, cfg, lw, n, lens, inv_freq, (&mut caches, l))?;
            capture_layer(gpu, capture, l, &self.x.slice(..n * h), (n, h), &mut cap.data)?;
        }
        Ok(())
    }

    /// One decoder layer over `n` rows of `self.x` (see the module docs).
    #[allow(clippy::too_many_arguments)]
    fn layer_step(
        &mut self,
        gpu: &Gpu,
        cfg: &Qwen3Config,
        lw: &GpuLayer,
        n: usize,
        lens: &StepLens<'_>,
        inv_freq: &CudaSlice<f32>,
        (caches, l): (&mut LayersKv<'_>, usize),
    ) -> Result<()> {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
        let (q, kv, inter) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        let (nh, nkv, hd) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
        let e = gpu_err;
        let blas = &self.blas;
        let qkv_dim = q + 2 * kv;

        // q|k|v = round(RMSNorm_in(x)) · W_qkvᵀ.
        let x = self.x.slice(..n * h);
        let u = normed_input(gpu, &lw.qkv_proj, &x, &lw.input_layernorm, eps, n, &mut self.half_in, &mut self.f32_in)?;
        gpu.gemm(blas, &lw.qkv_proj, &u, &mut self.qkv.slice_mut(..n * qkv_dim), (n, h, qkv_dim), false).map_err(e)?;

        // Norms, RoPE and the cache append, then causal attention over the whole cache.
        {
            let (mut k_app, mut v_app) = caches.append_views(l);
            gpu.qkv_rope_append(
                &self.qkv.slice(..n * qkv_dim),
                &lw.q_norm.as_view(),
                &lw.k_norm.as_view(),
                &inv_freq.as_view(),
                &mut self.q.slice_mut(..n * q),
                &mut k_app,
                &mut v_app,
                (n, nh, nkv),
                lens,
                eps,
            )
            .map_err(e)?;
        }
        let (k_read, v_read) = caches.read_views(l, lens.kv_cap * kv);
        let o = &mut self.o.slice_mut(..n * q);
        let q_in = self.q.slice(..n * q);
        if matches!(hd, 64 | 128) {
            gpu.attention_prefill(&q_in, &k_read, &v_read, o, n, lens, (nh, nkv, hd)).map_err(e)?;
        } else {
            // Head dims the tensor-core kernel is not built for take the per-head kernel.
            gpu.attention(&q_in, &k_read, &v_read, o, n, lens, (nh, nkv, hd), true).map_err(e)?;
        }

        // x += round(o) · W_oᵀ.
        let o_in = match Half::of(&lw.o_proj) {
            Some(half) => {
                gpu.cast_to(half, &self.o.slice(..n * q), &mut self.half_in.slice_mut(..n * q), n * q).map_err(e)?;
                GemmIn::Half(self.half_in.slice(..n * q))
            }
            None => GemmIn::F32(self.o.slice(..n * q)),
        };
        gpu.gemm(blas, &lw.o_proj, &o_in, &mut self.x.slice_mut(..n * h), (n, q, h), true).map_err(e)?;

        // gate|up = round(RMSNorm_post(x)) · W_gate|upᵀ; act = round(silu(gate) ⊙ up).
        let x = self.x.slice(..n * h);
        let u = normed_input(
            gpu,
            &lw.gate_up,
            &x,
            &lw.post_attention_layernorm,
            eps,
            n,
            &mut self.half_in,
            &mut self.f32_in,
        )?;
        gpu.gemm(blas, &lw.gate_up, &u, &mut self.gate_up.slice_mut(..n * 2 * inter), (n, h, 2 * inter), false)
            .map_err(e)?;
        let gu = self.gate_up.slice(..n * 2 * inter);
        let act = match Half::of(&lw.down_proj) {
            Some(half) => {
                gpu.swiglu_pairs_to(half, &gu, &mut self.half_in.slice_mut(..n * inter), inter, n).map_err(e)?;
                GemmIn::Half(self.half_in.slice(..n * inter))
            }
            None => {
                gpu.swiglu_pairs(&gu, &mut self.f32_in.slice_mut(..n * inter), inter, n).map_err(e)?;
                GemmIn::F32(self.f32_in.slice(..n * inter))
            }
        };
        // x += act · W_downᵀ.
        gpu.gemm(blas, &lw.down_proj, &act, &mut self.x.slice_mut(..n * h), (n, inter, h), true).map_err(e)?;
        Ok(())
    }
}

/// The RMSNorm of `x` with weight `gamma` as the input of a GEMM with weights `w`: rounded into
/// `half_in` for 16-bit weights, f32 in `f32_in` otherwise.
#[allow(clippy::too_many_arguments)]
pub(crate) fn normed_input<'a>(
    gpu: &Gpu,
    w: &WeightBuf,
    x: &cudarc::driver::CudaView<f32>,
    gamma: &CudaSlice<f32>,
    eps: f32,
    n: usize,
    half_in: &'a mut CudaSlice<u16>,
    f32_in: &'a mut CudaSlice<f32>,
) -> Result<GemmIn<'a>> {
    let h = gamma.len();
    Ok(match Half::of(w) {
        Some(half) => {
            let mut out: CudaViewMut<u16> = half_in.slice_mut(..n * h);
            gpu.rmsnorm_to(half, x, &gamma.as_view(), eps, n, &mut out).map_err(gpu_err)?;
            GemmIn::Half(half_in.slice(..n * h))
        }
        None => {
            gpu.rmsnorm(x, &gamma.as_view(), eps, n, &mut f32_in.slice_mut(..n * h)).map_err(gpu_err)?;
            GemmIn::F32(f32_in.slice(..n * h))
        }
    })
}

/// Locks a shared capture buffer.
pub(crate) fn lock(c: &SharedCapture) -> Result<MutexGuard<'_, Handoff<f32>>> {
    c.lock().map_err(|_| crate::error::Error::Request("prefill capture buffer poisoned".into()))
}

/// Where a draft's context rows take their keys and values from: every layer's k_proj|v_proj
/// rows, in one stacked copy or in each layer's own fused q|k|v matrix.
#[derive(Clone, Copy)]
pub enum CtxKv<'a> {
    /// `[layers · 2·kv, H]`, a device copy of the rows (84 MB for DSpark-8B): one projection for
    /// all layers, its rows token-major ([`KvRowsLayout::TokenMajor`]).
    Stacked(&'a WeightBuf),
    /// The layers' own matrices, their k|v rows from row `q` on: one projection per layer, rows
    /// layer-major ([`KvRowsLayout::LayerMajor`]). Five launches where the stacked copy takes one
    /// (each 16.8 MB projection of DSpark-8B runs at about a third of the copy ceiling), for the
    /// copy's bytes: the plan of a small card (`--embeddings host`).
    Layers(&'a [GpuLayer], usize),
}

impl CtxKv<'_> {
    pub fn layout(&self) -> KvRowsLayout {
        match self {
            CtxKv::Stacked(_) => KvRowsLayout::TokenMajor,
            CtxKv::Layers(..) => KvRowsLayout::LayerMajor,
        }
    }

    /// A matrix of the projection's dtype (the layers share one: the draft's build checks it).
    pub fn dtype_of(&self) -> Option<&WeightBuf> {
        match self {
            CtxKv::Stacked(w) => Some(w),
            CtxKv::Layers(layers, _) => layers.first().map(|l| &l.qkv_proj),
        }
    }

    /// `y = W_kv · u` for `n` rows of `u` into `y` (`[n, width]`, `width = layers · 2·kv`, in
    /// [`CtxKv::layout`]'s order): by `matvec` for a few rows, by GEMM (`blas`) for many.
    pub fn project(
        &self,
        gpu: &Gpu,
        blas: Option<&Blas>,
        u: &GemmIn<'_>,
        y: &mut CudaViewMut<f32>,
        (n, h, width): (usize, usize, usize),
    ) -> Result<()> {
        let run = |w: &WeightBuf, row0: usize, y: &mut CudaViewMut<f32>, out: usize| match (blas, u) {
            (Some(blas), u) => gpu.gemm_rows(blas, w, row0, u, y, (n, h, out), false),
            (None, GemmIn::F32(u)) => gpu.matvec_rows(w, row0, u, y, (n, h, out), false),
            (None, GemmIn::Half(_)) => {
                Err(dspark_kernels::cuda::CudaError::Shape("the draft's context k|v matvec takes f32 rows".into()))
            }
        };
        match *self {
            CtxKv::Stacked(w) => run(w, 0, &mut y.slice_mut(..n * width), width).map_err(gpu_err),
            CtxKv::Layers(layers, q) => {
                let per = width / layers.len().max(1);
                for (l, lw) in layers.iter().enumerate() {
                    run(&lw.qkv_proj, q, &mut y.slice_mut(l * n * per..(l + 1) * n * per), per).map_err(gpu_err)?;
                }
                Ok(())
            }
        }
    }
}

/// Rows of one chunk of a draft's context prefill: 1,024 rows keep its buffers at ~185 MB for
/// DSpark-8B while every GEMM stays past cuBLAS's plateau (1024 × 20480 × 4096 for fc).
pub const MAX_DRAFT_PREFILL_ROWS: usize = 1024;

/// A draft's context append of many rows (the prompt's) as GEMMs: fc over the tapped features,
/// the hidden norm, and one projection of every layer's k|v rows (the same math as the draft's
/// small-M `append_chunk`, with GEMM inputs rounded to the weights' dtype).
pub struct DraftPrefill {
    pub rows: usize,
    blas: Arc<Blas>,
    /// `[rows, T·H]` feature rows uploaded from the host (taken out while they are projected).
    pub features: Option<CudaSlice<f32>>,
    /// GEMM inputs of 16-bit weights: `[rows, T·H]`.
    half_in: CudaSlice<u16>,
    /// The hidden norm's output for f32 `ctx_kv` weights: `[rows, H]` (else empty).
    f32_in: CudaSlice<f32>,
    /// `[rows, H]` fc output.
    c: CudaSlice<f32>,
    /// `[rows, layers · 2·kv]` every layer's keys and values before their norm and RoPE.
    pub ctx_out: CudaSlice<f32>,
}

impl DraftPrefill {
    /// Plans chunks of `rows` rows of `t·h` features into `width` stacked k|v outputs.
    pub fn new(
        arena: &Arena,
        blas: Arc<Blas>,
        rows: usize,
        (t, h, width): (usize, usize, usize),
        fc: &WeightBuf,
        ctx_kv: CtxKv<'_>,
    ) -> Result<DraftPrefill> {
        let kv_half = ctx_kv.dtype_of().and_then(Half::of).is_some();
        let any_half = Half::of(fc).is_some() || kv_half;
        let z = |n: usize| arena.zeros::<f32>(n).map_err(drv);
        Ok(DraftPrefill {
            rows,
            blas,
            features: Some(z(rows * t * h)?),
            half_in: arena.zeros::<u16>(if any_half { rows * t * h } else { 1 }).map_err(drv)?,
            f32_in: z(if kv_half { 1 } else { rows * h })?,
            c: z(rows * h)?,
            ctx_out: z(rows * width)?,
        })
    }

    /// `c = fc · features`, then `ctx_out = ctx_kv · RMSNorm_hidden(c)` for `n` rows of
    /// `features` (`self.features` for host rows, the target's prefill captures otherwise).
    #[allow(clippy::too_many_arguments)]
    pub fn project(
        &mut self,
        gpu: &Gpu,
        features: &CudaView<f32>,
        fc: &WeightBuf,
        hidden_norm: &CudaSlice<f32>,
        ctx_kv: CtxKv<'_>,
        n: usize,
        (t, h, width): (usize, usize, usize),
        eps: f32,
    ) -> Result<()> {
        let e = gpu_err;
        let th = t * h;
        let input = match Half::of(fc) {
            Some(half) => {
                gpu.cast_to(half, &features.slice(..n * th), &mut self.half_in.slice_mut(..n * th), n * th)
                    .map_err(e)?;
                GemmIn::Half(self.half_in.slice(..n * th))
            }
            None => GemmIn::F32(features.slice(..n * th)),
        };
        gpu.gemm(&self.blas, fc, &input, &mut self.c.slice_mut(..n * h), (n, th, h), false).map_err(e)?;
        let c = self.c.slice(..n * h);
        let probe = ctx_kv.dtype_of().unwrap_or(fc);
        let u = normed_input(gpu, probe, &c, hidden_norm, eps, n, &mut self.half_in, &mut self.f32_in)?;
        ctx_kv.project(gpu, Some(&self.blas), &u, &mut self.ctx_out.slice_mut(..n * width), (n, h, width))
    }
}
