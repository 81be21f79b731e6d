//! Decoder-layer weights and the layer step on the GPU, shared by the CUDA target and draft.
//!
//! One step over `n` rows at positions `first_pos ..`:
//!
//! ```text
//! u = RMSNorm_in(x);  q, k, v = Wq u, Wk u, Wv u;  q, k = RoPE(norm(q)), RoPE(norm(k))
//! K/V cache rows [cache_row, cache_row + n) ← k, v
//! o = attention(q, cache rows [0, kv_len))                (causal for the target, not the draft)
//! x += Wo o                                               (matvec in accumulate mode)
//! u = RMSNorm_post(x);  x += down(silu(gate u) ⊙ up u)    (gate|up fused into one matvec)
//! ```
//!
//! Weights stay in the checkpoint dtype; every buffer comes from the arena at load.

use crate::config::Qwen3Config;
use crate::error::{Error, Result};
use crate::safetensors::Checkpoint;
use cudarc::driver::{CudaSlice, CudaViewMut};
use dspark_kernels::cuda::ops::WeightBuf;
use dspark_kernels::cuda::{CudaError, Gpu};
use dspark_tensor::arena::Arena;
use dspark_tensor::DType;

/// Converts CUDA errors into the model error type.
pub(crate) fn gpu_err(e: impl Into<CudaError>) -> Error {
    Error::Request(e.into().to_string())
}

pub(crate) fn drv(e: cudarc::driver::DriverError) -> Error {
    gpu_err(CudaError::Driver(e))
}

/// Uploads a matrix in its checkpoint dtype.
pub(crate) fn weight(arena: &Arena, ck: &Checkpoint, name: &str, shape: &[usize]) -> Result<WeightBuf> {
    let (dtype, bytes) = ck.raw(name, shape)?;
    arena.weight(dtype, bytes).map_err(drv)
}

/// Uploads a small vector as f32.
pub(crate) fn vector(arena: &Arena, ck: &Checkpoint, name: &str, shape: &[usize]) -> Result<CudaSlice<f32>> {
    arena.upload(&ck.f32(name, shape)?).map_err(drv)
}

/// Uploads rows `a` then rows `b` as one matrix (gate|up), in their dtype when they agree.
fn stacked(arena: &Arena, ck: &Checkpoint, a: &str, b: &str, shape: &[usize]) -> Result<WeightBuf> {
    let (da, ba) = ck.raw(a, shape)?;
    let (db, bb) = ck.raw(b, shape)?;
    if da == db {
        let mut bytes = ba.to_vec();
        bytes.extend_from_slice(bb);
        arena.weight(da, &bytes).map_err(drv)
    } else {
        let mut v = ck.f32(a, shape)?;
        v.extend(ck.f32(b, shape)?);
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        arena.weight(DType::F32, &bytes).map_err(drv)
    }
}

/// One decoder layer on the device.
pub struct GpuLayer {
    pub input_layernorm: CudaSlice<f32>,
    pub q_proj: WeightBuf,
    pub k_proj: WeightBuf,
    pub v_proj: WeightBuf,
    pub o_proj: WeightBuf,
    pub q_norm: CudaSlice<f32>,
    pub k_norm: CudaSlice<f32>,
    pub post_attention_layernorm: CudaSlice<f32>,
    /// `[2·I, H]`: gate rows then up rows.
    pub gate_up: WeightBuf,
    pub down_proj: WeightBuf,
}

impl GpuLayer {
    pub fn load(arena: &Arena, cfg: &Qwen3Config, ck: &Checkpoint, prefix: &str) -> Result<GpuLayer> {
        let (h, i, q, kv, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let n = |s: &str| format!("{prefix}{s}");
        Ok(GpuLayer {
            input_layernorm: vector(arena, ck, &n("input_layernorm.weight"), &[h])?,
            q_proj: weight(arena, ck, &n("self_attn.q_proj.weight"), &[q, h])?,
            k_proj: weight(arena, ck, &n("self_attn.k_proj.weight"), &[kv, h])?,
            v_proj: weight(arena, ck, &n("self_attn.v_proj.weight"), &[kv, h])?,
            o_proj: weight(arena, ck, &n("self_attn.o_proj.weight"), &[h, q])?,
            q_norm: vector(arena, ck, &n("self_attn.q_norm.weight"), &[hd])?,
            k_norm: vector(arena, ck, &n("self_attn.k_norm.weight"), &[hd])?,
            post_attention_layernorm: vector(arena, ck, &n("post_attention_layernorm.weight"), &[h])?,
            gate_up: stacked(arena, ck, &n("mlp.gate_proj.weight"), &n("mlp.up_proj.weight"), &[i, h])?,
            down_proj: weight(arena, ck, &n("mlp.down_proj.weight"), &[h, i])?,
        })
    }
}

/// Activation buffers for steps of up to `rows` rows.
pub struct Scratch {
    pub rows: usize,
    pub u: CudaSlice<f32>,
    pub q: CudaSlice<f32>,
    pub k: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
    pub o: CudaSlice<f32>,
    pub gate_up: CudaSlice<f32>,
    pub act: CudaSlice<f32>,
}

impl Scratch {
    pub fn new(arena: &Arena, cfg: &Qwen3Config, rows: usize) -> Result<Scratch> {
        let z = |n: usize| arena.zeros::<f32>(rows * n).map_err(drv);
        Ok(Scratch {
            rows,
            u: z(cfg.hidden_size)?,
            q: z(cfg.q_dim())?,
            k: z(cfg.kv_dim())?,
            v: z(cfg.kv_dim())?,
            o: z(cfg.q_dim())?,
            gate_up: z(2 * cfg.intermediate_size)?,
            act: z(cfg.intermediate_size)?,
        })
    }
}

/// Where a layer step reads and writes its K/V.
pub struct CacheRows<'a> {
    pub k: &'a mut CudaSlice<f32>,
    pub v: &'a mut CudaSlice<f32>,
    /// First cache row the step's keys go to.
    pub row: usize,
    /// Rows attention reads (`0..kv_len`), including the new ones.
    pub kv_len: usize,
}

/// Runs one layer over `n` rows of `x` (`[n, H]`, updated in place).
#[allow(clippy::too_many_arguments)]
pub fn layer_step(
    gpu: &Gpu,
    cfg: &Qwen3Config,
    lw: &GpuLayer,
    s: &mut Scratch,
    x: &mut CudaViewMut<f32>,
    n: usize,
    first_pos: usize,
    inv_freq: &CudaSlice<f32>,
    cache: CacheRows<'_>,
    causal: bool,
) -> Result<()> {
    let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
    let (q, kv, inter) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
    let heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let e = gpu_err;
    gpu.rmsnorm(&x.as_view(), &lw.input_layernorm.as_view(), eps, n, &mut s.u.slice_mut(..n * h)).map_err(e)?;
    let u = s.u.slice(..n * h);
    gpu.matvec(&lw.q_proj, &u, &mut s.q.slice_mut(..n * q), (n, h, q), false).map_err(e)?;
    gpu.matvec(&lw.k_proj, &u, &mut s.k.slice_mut(..n * kv), (n, h, kv), false).map_err(e)?;
    gpu.matvec(&lw.v_proj, &u, &mut s.v.slice_mut(..n * kv), (n, h, kv), false).map_err(e)?;
    gpu.qk_norm_rope(
        &mut s.q.slice_mut(..n * q),
        &lw.q_norm.as_view(),
        &inv_freq.as_view(),
        n,
        heads.0,
        first_pos,
        eps,
    )
    .map_err(e)?;
    gpu.qk_norm_rope(
        &mut s.k.slice_mut(..n * kv),
        &lw.k_norm.as_view(),
        &inv_freq.as_view(),
        n,
        heads.1,
        first_pos,
        eps,
    )
    .map_err(e)?;
    let rows = cache.row * kv..(cache.row + n) * kv;
    gpu.stream.memcpy_dtod(&s.k.slice(..n * kv), &mut cache.k.slice_mut(rows.clone())).map_err(drv)?;
    gpu.stream.memcpy_dtod(&s.v.slice(..n * kv), &mut cache.v.slice_mut(rows)).map_err(drv)?;
    let lim = cache.kv_len * kv;
    gpu.attention(
        &s.q.slice(..n * q),
        &cache.k.slice(..lim),
        &cache.v.slice(..lim),
        &mut s.o.slice_mut(..n * q),
        n,
        cache.kv_len,
        heads,
        causal.then_some(first_pos),
    )
    .map_err(e)?;
    gpu.matvec(&lw.o_proj, &s.o.slice(..n * q), x, (n, q, h), true).map_err(e)?;
    gpu.rmsnorm(&x.as_view(), &lw.post_attention_layernorm.as_view(), eps, n, &mut s.u.slice_mut(..n * h))
        .map_err(e)?;
    gpu.matvec(&lw.gate_up, &s.u.slice(..n * h), &mut s.gate_up.slice_mut(..n * 2 * inter), (n, h, 2 * inter), false)
        .map_err(e)?;
    gpu.swiglu(&s.gate_up.slice(..n * 2 * inter), inter, n, &mut s.act.slice_mut(..n * inter)).map_err(e)?;
    gpu.matvec(&lw.down_proj, &s.act.slice(..n * inter), x, (n, inter, h), true).map_err(e)?;
    Ok(())
}
