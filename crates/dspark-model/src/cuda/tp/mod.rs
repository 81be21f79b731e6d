//! Tensor parallelism on CUDA (issue #32): a Qwen3 target split over N ranks as [`crate::tp`]
//! plans it, one thread driving every rank's GPU, the collectives NCCL's ([`collective`]).
//!
//! ```text
//! every rank r:  x_r = embed_r(ids)  (its vocabulary rows, zeros for the rest)     all-reduce x
//! each layer:    u = RMSNorm(x_r);  qkv_r = u · Wqkv_r;  o_r = attention over its heads and cache
//!                p_r = o_r · Wo_r  (its columns)                                   all-reduce p;  x_r += p
//!                u = RMSNorm(x_r);  a_r = SwiGLU(u · Wgate|up_r);  p_r = a_r · Wdown_r  all-reduce p;  x_r += p
//! logits:        l_r = RMSNorm(x_r) · Wlm_r  (its vocabulary rows), gathered along the vocabulary
//! ```
//!
//! x stays replicated: every rank adds the same all-reduced partial, so every rank holds the same
//! residual stream, and rank 0's rows are the layer captures a draft reads. The layer step is
//! not `layers::run_layers`: that one folds the residual add into the o and down epilogues (and
//! the next RMSNorm into their outputs), and a split model must sum the ranks' partials before
//! the add. So this step runs the plain kernels — RMSNorm, matvec, the folded RoPE + attention,
//! SwiGLU matvec — with the add after each all-reduce. At N = 1 the single-GPU target
//! (`CudaQwen3`) stays the path (its bits are today's); this struct is for N ≥ 2, and its N = 1
//! is a test of the split step against that target.
//!
//! Ranks on distinct GPUs all-reduce through NCCL; ranks sharing one GPU (the same `Gpu`, hence
//! one stream) through [`collective::SameDevice`], how N > 1 runs before a multi-GPU machine is
//! lent. Steps launch eagerly (no CUDA graphs yet). `forward` gathers full logits on the host;
//! `forward_greedy` takes each rank's argmax and its value on the device and gathers those two
//! words a row (`tp::gather_argmax`), so no logits leave a GPU. A CUDA draft runs on rank 0's GPU
//! ([`CudaQwen3Tp::draft_host`]) with its own heads, reads the captured layers there (rank 0's
//! all-reduced rows, copied into the buffer it shares), and `verify_greedy` reads its proposal
//! back from that GPU.

pub mod collective;
mod rank;
pub mod shard;

use crate::backend::{
    check_capture, check_forward, check_truncate, verify_on_host, Captured, Deferred, DeviceRows, Forward, Greedy,
    LogitRows, Proposal, TargetModel,
};
use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::safetensors::Checkpoint;
use crate::cuda::dspark::DraftHost;
use crate::cuda::handoff::{handoff_id, Handoff, SharedCapture, SharedDraftRows, SharedTokens};
use crate::cuda::layers::{capture_layer, drv, gpu_err};
use crate::cuda::qwen3::CHUNK;
use crate::cuda::weights::WeightSource;
use crate::error::{Error, Result};
use crate::tp::{gather_argmax, TpShard};
use collective::{AllReduce, Nccl, SameDevice};
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::kv::KvDtype;
use dspark_kernels::cuda::Gpu;
use rank::Rank;
use shard::ShardSource;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A Qwen3 target split over the GPUs of one host (see the module docs).
pub struct CudaQwen3Tp {
    cfg: Qwen3Config,
    gpus: Vec<Arc<Gpu>>,
    ranks: Vec<Rank>,
    comm: Box<dyn AllReduce>,
    len: usize,
    max_len: usize,
    capture: Vec<usize>,
    /// What a draft on rank 0's GPU shares with this target (`DraftHost`): the capture buffer
    /// (`forward_greedy`'s captures, once a CUDA draft attaches), where its proposals land (read
    /// by `verify_greedy`), and the sampled draft's rows.
    draft_side: (SharedCapture, SharedTokens, SharedDraftRows),
    /// Whether `forward_greedy` leaves its captures on rank 0's GPU: set when a CUDA draft
    /// attaches through [`CudaQwen3Tp::draft_host`]; otherwise (a CPU draft) they come to the host.
    device_captures: bool,
}

impl CudaQwen3Tp {
    /// Loads the model in `dir` split over `gpus` (one rank each; the same `Gpu` repeated puts
    /// several ranks on one device), with KV caches of `max_len` positions of `kv`.
    pub fn load(gpus: Vec<Arc<Gpu>>, dir: &Path, max_len: usize, kv: KvDtype) -> Result<CudaQwen3Tp> {
        let cfg = Qwen3Config::from_dir(dir)?;
        let ck = Checkpoint::open_dir(dir)?;
        crate::checkpoint::config::check_tied_head(&cfg, ck.contains("lm_head.weight"))?;
        let full = cfg.clone();
        Self::from_sources(gpus, cfg, max_len, kv, |shard| {
            Box::new(ShardSource { ck: &ck, full: &full, shard: shard.clone() })
        })
    }

    /// The split model with each rank's weights from `source(shard)` (a checkpoint's slices, or
    /// random bench weights of the rank's shapes).
    pub fn from_sources<'c>(
        gpus: Vec<Arc<Gpu>>,
        cfg: Qwen3Config,
        max_len: usize,
        kv: KvDtype,
        source: impl Fn(&TpShard) -> Box<dyn WeightSource + 'c>,
    ) -> Result<CudaQwen3Tp> {
        let n = gpus.len();
        let shards = TpShard::plan(&cfg, n)?;
        let comm: Box<dyn AllReduce> = match gpus.first() {
            Some(g) if gpus.iter().all(|o| Arc::ptr_eq(o, g)) => Box::new(SameDevice),
            _ => {
                let mut ordinals: Vec<usize> = gpus.iter().map(|g| g.ctx.ordinal()).collect();
                ordinals.sort_unstable();
                ordinals.dedup();
                if ordinals.len() != n {
                    return Err(Error::Request(format!(
                        "--tensor-parallel {n}: one rank per GPU, or every rank on one GPU (got devices {ordinals:?})"
                    )));
                }
                Box::new(Nccl::new(&gpus)?)
            }
        };
        let max_len = max_len.min(cfg.max_position_embeddings).max(1);
        let ranks = gpus
            .iter()
            .zip(shards)
            .map(|(gpu, shard)| Rank::load(gpu.clone(), &cfg, source(&shard).as_ref(), shard, max_len, kv))
            .collect::<Result<Vec<_>>>()?;
        let a = &ranks.first().ok_or_else(|| Error::Request("--tensor-parallel 0".into()))?.arena;
        let draft_side = (
            Arc::new(Mutex::new(Handoff { data: a.zeros::<f32>(1).map_err(drv)?, generation: 0 })),
            Arc::new(Mutex::new(Handoff { data: a.zeros::<u32>(CHUNK).map_err(drv)?, generation: 0 })),
            Arc::new(Mutex::new(None)),
        );
        Ok(CudaQwen3Tp {
            cfg,
            gpus,
            ranks,
            comm,
            len: 0,
            max_len,
            capture: Vec::new(),
            draft_side,
            device_captures: false,
        })
    }

    /// The side a draft on rank 0's GPU takes ([`DraftHost`]): that GPU, this target's config
    /// and context, no heads (they are vocabulary shards: the draft loads its own), no GEMM
    /// prefill (the draft appends a prompt's captures, a chunk at a time, on its small-M path).
    /// From now on `forward_greedy` leaves its captures in the buffer the draft reads.
    pub fn draft_host(&mut self) -> Result<DraftHost> {
        self.device_captures = true;
        let r0 = self.ranks.first().ok_or_else(|| Error::Request("a split target without ranks".into()))?;
        Ok(DraftHost {
            gpu: r0.gpu.clone(),
            cfg: self.cfg.clone(),
            max_len: self.max_len,
            kv_dtype: r0.caches.dtype(),
            heads: None,
            prefill_blas: None,
            prefill_rows: 0,
            prefill_capture: None,
            capture: self.draft_side.0.clone(),
            tokens: self.draft_side.1.clone(),
            draft_rows: self.draft_side.2.clone(),
        })
    }

    /// Ranks.
    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// The collective in use (`nccl` or `same-device`).
    pub fn collective(&self) -> &'static str {
        self.comm.name()
    }

    /// Device bytes each rank holds.
    pub fn rank_bytes(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r.arena.bytes()).collect()
    }

    /// Mean wall time of one all-reduce of `rows` hidden-size rows over `iters` calls, every
    /// rank's stream synchronised after the last, µs (`dspark bench --tensor-parallel`).
    pub fn time_all_reduce(&mut self, rows: usize, iters: usize) -> Result<f64> {
        let len = rows.clamp(1, CHUNK) * self.cfg.hidden_size;
        let sync = |gpus: &[Arc<Gpu>]| gpus.iter().try_for_each(|g| g.stream.synchronize().map_err(drv));
        self.all_reduce(true, len)?;
        sync(&self.gpus)?;
        let t = std::time::Instant::now();
        for _ in 0..iters.max(1) {
            self.all_reduce(true, len)?;
        }
        sync(&self.gpus)?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64)
    }

    /// Sums each rank's `x` (`partial` false) or `partial` (true) over its first `len` values.
    fn all_reduce(&mut self, partial: bool, len: usize) -> Result<()> {
        let mut bufs: Vec<&mut CudaSlice<f32>> =
            self.ranks.iter_mut().map(|r| if partial { &mut r.partial } else { &mut r.x }).collect();
        self.comm.all_reduce(&self.gpus, &mut bufs, len)
    }

    /// Every rank: `x += partial` (after the partial's all-reduce).
    fn add_partials(&mut self, len: usize) -> Result<()> {
        for r in &mut self.ranks {
            r.gpu.add_into(&mut r.x.slice_mut(..len), &r.partial.slice(..len)).map_err(gpu_err)?;
        }
        Ok(())
    }

    /// One step of `tokens` (at most [`CHUNK`]) through every layer: the residual stream left
    /// in each rank's `x`. The captured layers' rows go to the host (returned), or with
    /// `on_device` into the capture buffer a draft on rank 0's GPU reads (returned empty).
    fn layers(&mut self, tokens: &[u32], on_device: bool) -> Result<Vec<f32>> {
        let n = tokens.len();
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps as f32);
        let (first_pos, kv_len) = (self.len, self.len + n);
        let mut up = vec![first_pos as u32, kv_len as u32];
        up.extend_from_slice(tokens);
        for r in &mut self.ranks {
            // The copy also orders the step after every earlier kernel on the rank's stream (the
            // attention kernels read settled cache rows before their PDL wait).
            r.gpu.stream.memcpy_htod(&up, &mut r.step_in.slice_mut(..2 + n)).map_err(drv)?;
            let ids = r.step_in.slice(2..2 + n);
            r.gpu
                .embedding_shard(&r.embed, h, &ids, n, r.shard.vocab.clone(), &mut r.x.slice_mut(..n * h))
                .map_err(gpu_err)?;
        }
        self.all_reduce(false, n * h)?;
        let t = self.capture.len();
        let mut captured = vec![0f32; if t > 0 && !on_device { n * t * h } else { 0 }];
        let shared = self.draft_side.0.clone();
        let mut cap = shared.lock().map_err(|_| Error::Request("capture buffer poisoned".into()))?;
        cap.generation += 1;
        for l in 0..self.cfg.num_hidden_layers {
            for r in &mut self.ranks {
                r.attention_partial(l, n, (first_pos, kv_len), eps)?;
            }
            self.all_reduce(true, n * h)?;
            self.add_partials(n * h)?;
            for r in &mut self.ranks {
                r.mlp_partial(l, n, eps)?;
            }
            self.all_reduce(true, n * h)?;
            self.add_partials(n * h)?;
            let r0 = &self.ranks[0];
            if on_device {
                capture_layer(&r0.gpu, &self.capture, l, &r0.x.slice(..n * h), (n, h), &mut cap.data)?;
            } else if let Some(slot) = self.capture.iter().position(|&c| c == l) {
                let mut host = vec![0f32; n * h];
                r0.gpu.stream.memcpy_dtoh(&r0.x.slice(..n * h), &mut host).map_err(drv)?;
                for (row, values) in host.chunks_exact(h).enumerate() {
                    captured[(row * t + slot) * h..][..h].copy_from_slice(values);
                }
            }
        }
        self.len = kv_len;
        Ok(captured)
    }

    /// Each rank's logits of rows `from..n` of the last step (the final norm, then its
    /// vocabulary rows of the head) into its `logits`; returns the rows.
    fn head(&mut self, from: usize, n: usize) -> Result<usize> {
        let (h, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps as f32);
        let rows = n - from;
        for r in &mut self.ranks {
            let (vr, s) = (r.shard.vocab.len(), &mut r.scratch);
            r.gpu
                .rmsnorm(&r.x.slice(from * h..n * h), &r.norm.as_view(), eps, rows, &mut s.u.slice_mut(..rows * h))
                .map_err(gpu_err)?;
            r.gpu
                .matvec(&r.head, &s.u.slice(..rows * h), &mut r.logits.slice_mut(..rows * vr), (rows, h, vr), false)
                .map_err(gpu_err)?;
        }
        Ok(rows)
    }

    /// One step with its logits rows `from..` and captures on the host.
    fn step(&mut self, tokens: &[u32], from: usize) -> Result<Forward> {
        let captured = self.layers(tokens, false)?;
        let rows = self.head(from, tokens.len())?;
        let v = self.cfg.vocab_size;
        let mut logits = vec![0f32; rows * v];
        for r in &self.ranks {
            let vr = r.shard.vocab.len();
            let mut host = vec![0f32; rows * vr];
            r.gpu.stream.memcpy_dtoh(&r.logits.slice(..rows * vr), &mut host).map_err(drv)?;
            for (row, values) in host.chunks_exact(vr).enumerate() {
                logits[row * v + r.shard.vocab.start..][..vr].copy_from_slice(values);
            }
        }
        Ok(Forward { logits, rows, captured })
    }

    /// One step whose rows `from..` end as ids: each rank's argmax and its value on the device,
    /// two words a row to the host, gathered there (`tp::gather_argmax`: the largest value, the
    /// lowest index among equals — the whole row's argmax); the captures stay on rank 0's GPU
    /// when a CUDA draft reads them there.
    fn step_greedy(&mut self, tokens: &[u32], from: usize) -> Result<Greedy> {
        let on_device = self.device_captures;
        let host = self.layers(tokens, on_device)?;
        let rows = self.head(from, tokens.len())?;
        let mut candidates = Vec::with_capacity(self.ranks.len());
        for r in &mut self.ranks {
            let (vr, s) = (r.shard.vocab.len(), &mut r.scratch);
            let logits = r.logits.slice(..rows * vr);
            r.gpu.argmax_split(&logits, vr, vr, rows, &mut r.ids.slice_mut(..rows), &mut s.ops).map_err(gpu_err)?;
            r.gpu.take_at(&logits, &r.ids.slice(..rows), vr, rows, &mut r.best.slice_mut(..rows)).map_err(gpu_err)?;
            let (mut ids, mut best) = (vec![0u32; rows], vec![0f32; rows]);
            r.gpu.stream.memcpy_dtoh(&r.ids.slice(..rows), &mut ids).map_err(drv)?;
            r.gpu.stream.memcpy_dtoh(&r.best.slice(..rows), &mut best).map_err(drv)?;
            candidates.push(best.into_iter().zip(ids).map(|(b, i)| (b, r.shard.vocab.start + i as usize)).collect());
        }
        let shared = self.draft_side.0.clone();
        let generation = shared.lock().map_err(|_| Error::Request("capture buffer poisoned".into()))?.generation;
        let n = tokens.len();
        let captured = if on_device && !self.capture.is_empty() {
            Captured::Device(DeviceRows { buffer: handoff_id(&shared), generation, first: 0, rows: n })
        } else {
            Captured::Host(host)
        };
        Ok(Greedy { ids: gather_argmax(&candidates), captured })
    }
}

impl TargetModel for CudaQwen3Tp {
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
        self.len = len;
        Ok(())
    }

    fn set_capture(&mut self, layers: &[usize]) -> Result<()> {
        check_capture(&self.cfg, layers)?;
        self.capture = layers.to_vec();
        // The device capture buffer on rank 0: planned when a draft attaches, never in a step.
        let need = CHUNK * layers.len() * self.cfg.hidden_size;
        let mut cap = self.draft_side.0.lock().map_err(|_| Error::Request("capture buffer poisoned".into()))?;
        if cap.data.len() < need {
            cap.data = self.ranks[0].arena.zeros::<f32>(need).map_err(drv)?;
        }
        Ok(())
    }

    fn prefill_chunk(&self) -> usize {
        CHUNK
    }

    /// Ids from each rank's candidates, gathered (see `step_greedy`), and the captures on rank
    /// 0's GPU; a prompt of more than [`CHUNK`] tokens through `forward` (its captures on the
    /// host, its ids the host argmax of the gathered logits — the same ids).
    fn forward_greedy(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Greedy> {
        check_forward(&self.cfg, self.len, self.max_len, tokens)?;
        if tokens.len() > CHUNK {
            let f = self.forward(tokens, rows)?;
            let v = self.cfg.vocab_size;
            let ids = (0..f.rows).map(|r| dspark_kernels::cpu::argmax::argmax(f.row(r, v)) as u32).collect();
            return Ok(Greedy { ids, captured: Captured::Host(f.captured) });
        }
        let from = match rows {
            LogitRows::All => 0,
            LogitRows::Last => tokens.len() - 1,
        };
        self.step_greedy(tokens, from)
    }

    /// A proposal a draft on rank 0's GPU left there ([`Deferred::OnDevice`]) comes to the host
    /// (k tokens), then verifies as any host proposal.
    fn verify_greedy(&mut self, anchor: u32, drafts: &Deferred, k: usize) -> Result<Greedy> {
        let Deferred::OnDevice(d) = drafts else {
            return verify_on_host(self, anchor, drafts, k);
        };
        let shared = self.draft_side.1.clone();
        let mut tokens = vec![0u32; k];
        {
            let t = shared.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
            if (d.buffer, d.generation) != (handoff_id(&shared), t.generation) || k > d.len || k >= CHUNK {
                return Err(Error::Request(
                    "device draft tokens are stale, from another target, or more than the proposal holds".into(),
                ));
            }
            let r0 = &self.ranks[0];
            r0.gpu.stream.memcpy_dtoh(&t.data.slice(..k), &mut tokens).map_err(drv)?;
        }
        let proposal = Deferred::Ready(Proposal { tokens, ..Default::default() });
        verify_on_host(self, anchor, &proposal, k)
    }

    /// Full logits, each rank's vocabulary rows gathered on the host; prompts in steps of
    /// [`CHUNK`] rows.
    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward> {
        check_forward(&self.cfg, self.len, self.max_len, tokens)?;
        let mut out = Forward::default();
        let mut chunks = tokens.chunks(CHUNK).peekable();
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let from = match rows {
                LogitRows::All => 0,
                LogitRows::Last => chunk.len() - 1,
            };
            let f = self.step(chunk, from)?;
            out.captured.extend_from_slice(&f.captured);
            if matches!(rows, LogitRows::All) || last {
                out.logits.extend_from_slice(&f.logits);
                out.rows += f.rows;
            }
        }
        Ok(out)
    }
}
