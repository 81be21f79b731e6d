//! Building [`CudaQwen3`]: from an HF folder (after the plan's memory check, through the
//! staging upload) or from any [`WeightSource`], with every buffer a step, a prefill chunk or
//! the sampler needs allocated once on the model's arena, laid out as the [`TargetPlan`] says
//! (the embedding on the device or in mapped host memory, the KV caches' dtype, the GEMM
//! prefill's chunk rows).

use super::{sampled, CudaQwen3, Handoff, CHUNK};
use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::safetensors::Checkpoint;
use crate::cuda::graphs::StepGraphs;
use crate::cuda::layers::{drv, kv_caches, GpuLayer, Scratch};
use crate::cuda::plan::{Embeddings, TargetPlan};
use crate::cuda::prefill::{Prefill, PrefillMode, MAX_PREFILL_ROWS};
use crate::cuda::weights::{CheckpointUpload, WeightSource};
use crate::error::Result;
use dspark_kernels::cpu::rope::inv_freq;
use dspark_kernels::cuda::host_table::Table;
use dspark_kernels::cuda::kv::KvDtype;
use dspark_kernels::cuda::sample::CFG_WORDS;
use dspark_kernels::cuda::Gpu;
use dspark_tensor::arena::Arena;
use std::path::Path;
use std::sync::{Arc, Mutex};

impl CudaQwen3 {
    /// Loads an HF model folder onto `gpu`, with a KV cache of `max_len` positions (capped at
    /// `max_position_embeddings`).
    pub fn load(gpu: Arc<Gpu>, dir: &Path, max_len: usize) -> Result<CudaQwen3> {
        Self::load_kv(gpu, dir, max_len, KvDtype::F32)
    }

    /// [`CudaQwen3::load`] with the KV caches' element type chosen (`--kv-cache`).
    pub fn load_kv(gpu: Arc<Gpu>, dir: &Path, max_len: usize, kv: KvDtype) -> Result<CudaQwen3> {
        Self::load_plan(gpu, dir, TargetPlan::new(max_len, kv))
    }

    /// [`CudaQwen3::load`] laid out as `plan` says (`--embeddings`, `--prefill-chunk`), after a
    /// check that the device-resident weights and the plan's buffers fit.
    pub fn load_plan(gpu: Arc<Gpu>, dir: &Path, plan: TargetPlan) -> Result<CudaQwen3> {
        let cfg = Qwen3Config::from_dir(dir)?;
        plan.check(&cfg)?;
        let ck = Checkpoint::open_dir(dir)?;
        let up = CheckpointUpload::new_without(&ck, &gpu.ctx, plan.device_bytes(&cfg), plan.host_tensors())?;
        let t = Self::from_source_plan(gpu, cfg, &up, plan)?;
        up.finish()?;
        Ok(t)
    }

    /// Builds the target from any [`WeightSource`] (a checkpoint, or random bench weights).
    pub fn from_source(gpu: Arc<Gpu>, cfg: Qwen3Config, ck: &dyn WeightSource, max_len: usize) -> Result<CudaQwen3> {
        Self::from_source_kv(gpu, cfg, ck, max_len, KvDtype::F32)
    }

    /// [`CudaQwen3::from_source`] with the KV caches' element type chosen.
    pub fn from_source_kv(
        gpu: Arc<Gpu>,
        cfg: Qwen3Config,
        ck: &dyn WeightSource,
        max_len: usize,
        kv_dtype: KvDtype,
    ) -> Result<CudaQwen3> {
        Self::from_source_plan(gpu, cfg, ck, TargetPlan::new(max_len, kv_dtype))
    }

    /// [`CudaQwen3::from_source`] laid out as `plan` says.
    pub fn from_source_plan(
        gpu: Arc<Gpu>,
        cfg: Qwen3Config,
        ck: &dyn WeightSource,
        plan: TargetPlan,
    ) -> Result<CudaQwen3> {
        plan.check(&cfg)?;
        let arena = Arena::new(gpu.stream.clone());
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let (max_len, kv_dtype) = (plan.context(&cfg), plan.kv);
        crate::checkpoint::config::check_tied_head(&cfg, ck.contains("lm_head.weight"))?;
        let embed_name = "model.embed_tokens.weight";
        let (embed_tokens, lm_head) = match plan.embeddings {
            Embeddings::Host => {
                let table = Table::Host(ck.host_table(&gpu.ctx, embed_name, &[v, h])?);
                (Arc::new(table), Arc::new(ck.matrix(&arena, "lm_head.weight", &[v, h])?))
            }
            Embeddings::Device => {
                let e = Arc::new(ck.matrix(&arena, embed_name, &[v, h])?);
                let head = if cfg.tie_word_embeddings {
                    e.clone()
                } else {
                    Arc::new(ck.matrix(&arena, "lm_head.weight", &[v, h])?)
                };
                (Arc::new(Table::Device(e)), head)
            }
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| GpuLayer::load(&arena, &cfg, ck, &format!("model.layers.{l}.")))
            .collect::<Result<Vec<_>>>()?;
        crate::cuda::layers_gemm::plan_row_gemms(&gpu, &cfg, &layers);
        crate::cuda::layers_gemm::plan_head(&gpu, &lm_head, h, v);
        let norm = ck.vector(&arena, "model.norm.weight", &[h])?;
        let inv = arena.upload(&inv_freq(cfg.rope_theta as f32, cfg.head_dim)).map_err(drv)?;
        let (kv, n) = (cfg.kv_dim(), cfg.num_hidden_layers);
        let caches = kv_caches(&arena, kv_dtype, n, max_len * kv)?;
        let scratch = Scratch::new(&arena, &cfg, CHUNK, gpu.sms)?;
        let step_in = arena.zeros::<u32>(2 + CHUNK + CFG_WORDS).map_err(drv)?;
        let sample = sampled::plan(&arena, sampled::SAMPLE_ROWS, v)?;
        let x = arena.zeros::<f32>(CHUNK * h).map_err(drv)?;
        let logits = arena.zeros::<f32>(CHUNK * v).map_err(drv)?;
        let captured = Arc::new(Mutex::new(Handoff { data: arena.zeros::<f32>(1).map_err(drv)?, generation: 0 }));
        let next_ids = arena.zeros::<u32>(CHUNK).map_err(drv)?;
        let drafted = Arc::new(Mutex::new(Handoff { data: arena.zeros::<u32>(CHUNK).map_err(drv)?, generation: 0 }));
        let prefill = if plan.gemm_rows(&cfg) > 0 {
            let mut p = Prefill::new(&gpu, &arena, &cfg, &layers, plan.gemm_rows(&cfg))?;
            if let Some(first) = layers.first() {
                p.warm_up(&gpu, &cfg, first)?;
            }
            Some(p)
        } else {
            None
        };
        let prefill_in = arena.zeros::<u32>(2 + prefill.as_ref().map_or(0, |p| p.rows)).map_err(drv)?;
        Ok(CudaQwen3 {
            gpu,
            arena,
            cfg,
            max_len,
            embed_tokens,
            lm_head,
            layers,
            norm,
            inv_freq: inv,
            caches,
            len: 0,
            capture: Vec::new(),
            scratch,
            step_in,
            graphs: StepGraphs::new(),
            sample,
            device_sampling: true,
            prefill_sample: None,
            x,
            logits,
            next_ids,
            captured,
            drafted,
            draft_rows: Arc::new(Mutex::new(None)),
            prefill,
            prefill_in,
            prefill_mode: PrefillMode::default(),
            prefill_after: CHUNK,
            prefill_cap: MAX_PREFILL_ROWS,
        })
    }
}
