//! The Qwen3 target on the GPU, behind the same [`TargetModel`] trait as the CPU reference.
//!
//! Everything is planned at load: weights in their checkpoint dtype, the KV cache for
//! `max_len` positions, and activation buffers for steps of up to [`CHUNK`] rows. A forward
//! over more tokens (prefill) runs as consecutive chunks, each a causal step over the cache, so
//! no step allocates device memory. Logits and captured layer outputs are copied back to the
//! host, which is what the trait returns; the on-device argmax path comes with the benchmarks.

use crate::backend::{check_capture, check_forward, check_truncate, Forward, LogitRows, TargetModel};
use crate::config::Qwen3Config;
use crate::cuda_layers::{drv, gpu_err, layer_step, vector, weight, CacheRows, GpuLayer, Scratch};
use crate::error::Result;
use crate::safetensors::Checkpoint;
use cudarc::driver::CudaSlice;
use dspark_kernels::cpu::rope::inv_freq;
use dspark_kernels::cuda::ops::WeightBuf;
use dspark_kernels::cuda::Gpu;
use dspark_tensor::arena::Arena;
use std::path::Path;
use std::sync::Arc;

/// Most rows one device step processes (prefill runs in chunks of this size).
pub const CHUNK: usize = 64;

/// A Qwen3 target on one GPU.
pub struct CudaQwen3 {
    pub gpu: Arc<Gpu>,
    pub arena: Arena,
    cfg: Qwen3Config,
    max_len: usize,
    pub(crate) embed_tokens: Arc<WeightBuf>,
    /// `None` when tied to `embed_tokens`.
    pub(crate) lm_head: Option<Arc<WeightBuf>>,
    layers: Vec<GpuLayer>,
    norm: CudaSlice<f32>,
    inv_freq: CudaSlice<f32>,
    k_cache: Vec<CudaSlice<f32>>,
    v_cache: Vec<CudaSlice<f32>>,
    len: usize,
    capture: Vec<usize>,
    scratch: Scratch,
    ids: CudaSlice<u32>,
    x: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    /// `[T, CHUNK, H]`: captured layer outputs of the current chunk, slot-major.
    captured: CudaSlice<f32>,
}

impl CudaQwen3 {
    /// Loads an HF model folder onto `gpu`, with a KV cache of `max_len` positions (capped at
    /// `max_position_embeddings`).
    pub fn load(gpu: Arc<Gpu>, dir: &Path, max_len: usize) -> Result<CudaQwen3> {
        let cfg = Qwen3Config::from_dir(dir)?;
        let ck = Checkpoint::open_dir(dir)?;
        let arena = Arena::new(gpu.stream.clone());
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let max_len = max_len.min(cfg.max_position_embeddings).max(1);
        let embed_tokens = Arc::new(weight(&arena, &ck, "model.embed_tokens.weight", &[v, h])?);
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(Arc::new(weight(&arena, &ck, "lm_head.weight", &[v, h])?))
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| GpuLayer::load(&arena, &cfg, &ck, &format!("model.layers.{l}.")))
            .collect::<Result<Vec<_>>>()?;
        let norm = vector(&arena, &ck, "model.norm.weight", &[h])?;
        let inv = arena.upload(&inv_freq(cfg.rope_theta as f32, cfg.head_dim)).map_err(drv)?;
        let kv = cfg.kv_dim();
        let k_cache =
            (0..cfg.num_hidden_layers).map(|_| arena.zeros::<f32>(max_len * kv).map_err(drv)).collect::<Result<_>>()?;
        let v_cache =
            (0..cfg.num_hidden_layers).map(|_| arena.zeros::<f32>(max_len * kv).map_err(drv)).collect::<Result<_>>()?;
        let scratch = Scratch::new(&arena, &cfg, CHUNK)?;
        let ids = arena.zeros::<u32>(CHUNK).map_err(drv)?;
        let x = arena.zeros::<f32>(CHUNK * h).map_err(drv)?;
        let logits = arena.zeros::<f32>(CHUNK * v).map_err(drv)?;
        let captured = arena.zeros::<f32>(cfg.num_hidden_layers * CHUNK * h).map_err(drv)?;
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
            k_cache,
            v_cache,
            len: 0,
            capture: Vec::new(),
            scratch,
            ids,
            x,
            logits,
            captured,
        })
    }

    /// One chunk of at most [`CHUNK`] tokens; appends logits rows `[first_row..]` and captured rows.
    fn chunk(&mut self, tokens: &[u32], logit_from: Option<usize>, out: &mut Forward) -> Result<()> {
        let n = tokens.len();
        let c = &self.cfg;
        let (h, v) = (c.hidden_size, c.vocab_size);
        let first_pos = self.len;
        let gpu = self.gpu.clone();
        gpu.stream.memcpy_htod(tokens, &mut self.ids.slice_mut(..n)).map_err(drv)?;
        gpu.embedding(&self.embed_tokens, h, &self.ids.slice(..n), n, &mut self.x.slice_mut(..n * h))
            .map_err(gpu_err)?;
        let t = self.capture.len();
        for l in 0..self.layers.len() {
            let cache =
                CacheRows { k: &mut self.k_cache[l], v: &mut self.v_cache[l], row: first_pos, kv_len: first_pos + n };
            layer_step(
                &gpu,
                c,
                &self.layers[l],
                &mut self.scratch,
                &mut self.x.slice_mut(..n * h),
                n,
                first_pos,
                &self.inv_freq,
                cache,
                true,
            )?;
            for (slot, _) in self.capture.iter().enumerate().filter(|(_, &cl)| cl == l) {
                let dst = slot * CHUNK * h;
                gpu.stream
                    .memcpy_dtod(&self.x.slice(..n * h), &mut self.captured.slice_mut(dst..dst + n * h))
                    .map_err(drv)?;
            }
        }
        if let Some(from) = logit_from {
            let rows = n - from;
            let eps = c.rms_norm_eps as f32;
            gpu.rmsnorm(
                &self.x.slice(from * h..n * h),
                &self.norm.as_view(),
                eps,
                rows,
                &mut self.scratch.u.slice_mut(..rows * h),
            )
            .map_err(gpu_err)?;
            let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
            gpu.matvec(
                head,
                &self.scratch.u.slice(..rows * h),
                &mut self.logits.slice_mut(..rows * v),
                (rows, h, v),
                false,
            )
            .map_err(gpu_err)?;
            let mut host = vec![0f32; rows * v];
            gpu.stream.memcpy_dtoh(&self.logits.slice(..rows * v), &mut host).map_err(drv)?;
            out.logits.extend_from_slice(&host);
            out.rows += rows;
        }
        if t > 0 {
            let mut host = vec![0f32; t * CHUNK * h];
            gpu.stream.memcpy_dtoh(&self.captured.slice(..t * CHUNK * h), &mut host).map_err(drv)?;
            for r in 0..n {
                for slot in 0..t {
                    out.captured.extend_from_slice(&host[(slot * CHUNK + r) * h..][..h]);
                }
            }
        }
        self.len += n;
        Ok(())
    }
}

impl TargetModel for CudaQwen3 {
    fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    fn len(&self) -> usize {
        self.len
    }

    fn max_len(&self) -> usize {
        self.max_len
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        check_truncate(self.len, len)?;
        // Rows past `len` are simply overwritten by the next forward.
        self.len = len;
        Ok(())
    }

    fn set_capture(&mut self, layers: &[usize]) -> Result<()> {
        check_capture(&self.cfg, layers)?;
        self.capture = layers.to_vec();
        Ok(())
    }

    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward> {
        check_forward(&self.cfg, self.len, self.max_len, tokens)?;
        let mut out = Forward::default();
        let chunks: Vec<&[u32]> = tokens.chunks(CHUNK).collect();
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let from = match rows {
                LogitRows::All => Some(0),
                LogitRows::Last if i == last => Some(chunk.len() - 1),
                LogitRows::Last => None,
            };
            self.chunk(chunk, from, &mut out)?;
        }
        Ok(out)
    }
}
