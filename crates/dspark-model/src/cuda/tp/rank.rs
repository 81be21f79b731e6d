//! One rank of the tensor-parallel target ([`super::CudaQwen3Tp`]): its GPU, its slices of the
//! weights ([`TpShard`]), its KV cache and step buffers, and the two halves of a layer that run
//! on it alone — the attention and the MLP, each ending in this rank's partial of the residual
//! add, which the caller all-reduces before adding (the module docs of `tp` say why the layer
//! step is not `layers::run_layers`).

use crate::checkpoint::config::Qwen3Config;
use crate::cuda::layers::{drv, gpu_err, kv_caches, GpuLayer, Scratch};
use crate::cuda::qwen3::CHUNK;
use crate::cuda::weights::WeightSource;
use crate::error::Result;
use crate::tp::TpShard;
use cudarc::driver::CudaSlice;
use dspark_kernels::cpu::rope::inv_freq;
use dspark_kernels::cuda::kv::{KvCaches, KvDtype};
use dspark_kernels::cuda::ops::{StepLens, WeightBuf};
use dspark_kernels::cuda::rope_fold::RopeWeights;
use dspark_kernels::cuda::Gpu;
use dspark_tensor::arena::Arena;
use std::sync::Arc;

/// One rank: its GPU, its slices of the weights, its KV cache and its step buffers.
pub(super) struct Rank {
    pub(super) gpu: Arc<Gpu>,
    pub(super) shard: TpShard,
    /// The config its layers see (its heads, KV heads and intermediate size).
    pub(super) cfg: Qwen3Config,
    /// Holds every buffer of the rank.
    pub(super) arena: Arena,
    pub(super) embed: WeightBuf,
    pub(super) head: WeightBuf,
    pub(super) layers: Vec<GpuLayer>,
    pub(super) norm: CudaSlice<f32>,
    pub(super) inv_freq: CudaSlice<f32>,
    pub(super) caches: KvCaches,
    pub(super) scratch: Scratch,
    /// `[first_pos, kv_len, ids…]` of the step.
    pub(super) step_in: CudaSlice<u32>,
    /// `[CHUNK, H]`: the residual stream (the same on every rank).
    pub(super) x: CudaSlice<f32>,
    /// `[CHUNK, H]`: this rank's partial of o or down, all-reduced in place.
    pub(super) partial: CudaSlice<f32>,
    /// `[CHUNK, its vocabulary rows]`.
    pub(super) logits: CudaSlice<f32>,
    /// `[CHUNK]`: each row's argmax over this rank's vocabulary rows (local index), and its value.
    pub(super) ids: CudaSlice<u32>,
    pub(super) best: CudaSlice<f32>,
}

impl Rank {
    pub(super) fn load(
        gpu: Arc<Gpu>,
        full: &Qwen3Config,
        src: &dyn WeightSource,
        shard: TpShard,
        max_len: usize,
        kv: KvDtype,
    ) -> Result<Rank> {
        let arena = Arena::new(gpu.stream.clone());
        let cfg = shard.layer_config(full);
        let (h, vr) = (full.hidden_size, shard.vocab.len());
        let embed = src.matrix(&arena, "model.embed_tokens.weight", &[vr, h])?;
        let head_name = if full.tie_word_embeddings { "model.embed_tokens.weight" } else { "lm_head.weight" };
        let head = src.matrix(&arena, head_name, &[vr, h])?;
        let layers = (0..full.num_hidden_layers)
            .map(|l| GpuLayer::load(&arena, &cfg, src, &format!("model.layers.{l}.")))
            .collect::<Result<Vec<_>>>()?;
        let norm = src.vector(&arena, "model.norm.weight", &[h])?;
        let inv = arena.upload(&inv_freq(full.rope_theta as f32, full.head_dim)).map_err(drv)?;
        let caches = kv_caches(&arena, kv, full.num_hidden_layers, max_len * cfg.kv_dim())?;
        let scratch = Scratch::new(&arena, &cfg, CHUNK, gpu.sms)?;
        Ok(Rank {
            step_in: arena.zeros::<u32>(2 + CHUNK).map_err(drv)?,
            x: arena.zeros::<f32>(CHUNK * h).map_err(drv)?,
            partial: arena.zeros::<f32>(CHUNK * h).map_err(drv)?,
            logits: arena.zeros::<f32>(CHUNK * vr).map_err(drv)?,
            ids: arena.zeros::<u32>(CHUNK).map_err(drv)?,
            best: arena.zeros::<f32>(CHUNK).map_err(drv)?,
            gpu,
            shard,
            cfg,
            arena,
            embed,
            head,
            layers,
            norm,
            inv_freq: inv,
            caches,
            scratch,
        })
    }

    /// Layer `l`'s attention on this rank's heads: `partial = o_proj_r · attention(…)`.
    pub(super) fn attention_partial(
        &mut self,
        l: usize,
        n: usize,
        (first_pos, kv_len): (usize, usize),
        eps: f32,
    ) -> Result<()> {
        let c = &self.cfg;
        let (h, q, kv, hd) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.head_dim);
        let qkv_dim = q + 2 * kv;
        let (lw, s, g) = (&self.layers[l], &mut self.scratch, &self.gpu);
        g.rmsnorm(&self.x.slice(..n * h), &lw.input_layernorm.as_view(), eps, n, &mut s.u.slice_mut(..n * h))
            .map_err(gpu_err)?;
        g.matvec(&lw.qkv_proj, &s.u.slice(..n * h), &mut s.qkv.slice_mut(..n * qkv_dim), (n, h, qkv_dim), false)
            .map_err(gpu_err)?;
        let rope = RopeWeights {
            q_norm: &lw.q_norm.as_view(),
            k_norm: &lw.k_norm.as_view(),
            inv_freq: &self.inv_freq.as_view(),
            eps,
        };
        let lens = StepLens { dev: self.step_in.slice(..2), first_pos, kv_cap: kv_len };
        let mut caches = self.caches.layers_mut();
        let (mut k_app, mut v_app) = caches.append_views(l);
        g.rope_attention(
            &s.qkv.slice(..n * qkv_dim),
            &rope,
            &mut s.q.slice_mut(..n * q),
            (&mut k_app, &mut v_app),
            (&mut s.o.slice_mut(..n * q), false),
            n,
            &lens,
            (c.num_attention_heads, c.num_key_value_heads, hd),
            true,
            &mut s.ops,
        )
        .map_err(gpu_err)?;
        g.matvec(&lw.o_proj, &s.o.slice(..n * q), &mut self.partial.slice_mut(..n * h), (n, q, h), false)
            .map_err(gpu_err)
    }

    /// Layer `l`'s MLP on this rank's intermediate rows: `partial = down_r · SwiGLU(…)`.
    pub(super) fn mlp_partial(&mut self, l: usize, n: usize, eps: f32) -> Result<()> {
        let (h, i) = (self.cfg.hidden_size, self.cfg.intermediate_size);
        let (lw, s, g) = (&self.layers[l], &mut self.scratch, &self.gpu);
        g.rmsnorm(&self.x.slice(..n * h), &lw.post_attention_layernorm.as_view(), eps, n, &mut s.u.slice_mut(..n * h))
            .map_err(gpu_err)?;
        g.matvec_swiglu(
            &lw.gate_up,
            &s.u.slice(..n * h),
            &mut s.gate_up.slice_mut(..n * 2 * i),
            &mut s.act.slice_mut(..n * i),
            (n, h, i),
        )
        .map_err(gpu_err)?;
        g.matvec(&lw.down_proj, &s.act.slice(..n * i), &mut self.partial.slice_mut(..n * h), (n, i, h), false)
            .map_err(gpu_err)
    }
}
