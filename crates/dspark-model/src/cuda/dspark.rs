//! The DSpark draft on the GPU, behind the same [`Drafter`] trait as the CPU reference
//! (math in [`crate::cpu::dspark`] and [`crate::cpu::markov`]).
//!
//! Per layer the K/V cache holds `max_len` context rows plus `B` block rows: each round the
//! block's keys are written just past the context and attention reads context + block with no
//! mask; the next round overwrites them, which is how the block K/V are "discarded". The Markov
//! chain runs slot by slot on the device — the previous token is read from device memory
//! (the anchor, or the argmax just written for the previous slot) — so only the final draft
//! ids and confidence logits are copied back.

use crate::backend::{
    Captured, Deferred, DeviceSampled, DeviceTokens, Drafter, Filters, Proposal, SampleRow, SampledProposal,
};
use crate::checkpoint::draft_config::DraftConfig;
use crate::cpu::markov::prefix_survival;
use crate::cuda::graphs::StepGraphs;
use crate::cuda::layers::{drv, gpu_err, run_layers, GpuLayer, Scratch, Segment};
use crate::cuda::layers_gemm::head_product;
use crate::cuda::prefill::DraftPrefill;
use build::ctx_kv_of;
use chain::{Confidence, Markov, Variant};

mod batch;
mod build;
mod chain;
mod drafter;
mod host;
mod paged;
mod plan;
mod prefill;
mod sequences;
use crate::cuda::handoff::{handoff_id, SharedCapture, SharedDraftRows, SharedTokens};
use crate::cuda::qwen3::CHUNK;
use crate::error::{Error, Result};
pub use batch::CudaDrafts;
use cudarc::driver::{CudaSlice, CudaView};
use dspark_kernels::cuda::gemm::GemmIn;
use dspark_kernels::cuda::host_table::Table;
use dspark_kernels::cuda::ops::{StepLens, WeightBuf};
use dspark_kernels::cuda::sample::{sample_cfg, SampleIo, SampleScratch, SampleShape, CFG_WORDS, ROW_WORDS};
use dspark_kernels::cuda::Gpu;
use dspark_tensor::arena::Arena;
pub use host::DraftHost;
pub use plan::DraftSide;
pub use sequences::DraftSeq;
use std::sync::Arc;

/// The shape of a draft step, the key of its CUDA graph: appending `rows` context rows from the
/// feature buffer at device address `features`, or a proposal whose attention covers `kv_cap`
/// keys, its chain taking argmaxes or (with `sample`) drawing each slot into the draft rows at
/// address `rows`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum DraftStep {
    Append { rows: usize, features: u64, caches: u64 },
    Propose { kv_cap: usize, sample: Option<SampleShape>, rows: u64, caches: u64 },
}

/// How a proposal's chain picks each slot's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// The argmax (the greedy chain, fused into the W2 product when it can be).
    Argmax,
    /// A draw by the device sampler with the slot's cfg words in `step_in` (the sampled law).
    Sample(SampleShape),
}

/// A DSpark draft on one GPU.
pub struct CudaDraft {
    gpu: Arc<Gpu>,
    pub arena: Arena,
    cfg: DraftConfig,
    max_len: usize,
    embed_tokens: Arc<Table>,
    lm_head: Arc<WeightBuf>,
    /// Bytes of the draft's own copies left on the host because the target's equal them.
    shared_bytes: usize,
    fc: WeightBuf,
    hidden_norm: CudaSlice<f32>,
    layers: Vec<GpuLayer>,
    norm: CudaSlice<f32>,
    markov: Option<Markov>,
    confidence: Option<Confidence>,
    inv_freq: CudaSlice<f32>,
    /// Every layer's K/V cache, with the addresses the one-launch context append reads.
    caches: paged::CtxCaches,
    /// Context caches planned for more sequences (`sequences.rs`), not in use.
    seq_pool: Vec<paged::CtxCaches>,
    /// The pages of paged contexts (`paged.rs`, `--kv-capacity`).
    ctx_pages: Option<crate::cuda::kv_vmm::KvPages>,
    /// The buffers of block passes over several sequences (`batch.rs`), planned with them.
    block_batch: Option<batch::BlockBatch>,
    /// Every layer's k_proj|v_proj rows stacked `[layers · 2·kv, H]` (a device copy of the rows
    /// in `layers`, 84 MB for DSpark-8B): context rows take one projection for all layers. None
    /// beside a target whose embedding is in host memory: each layer's own rows, one projection
    /// a layer ([`crate::cuda::prefill::CtxKv`]).
    ctx_kv: Option<WeightBuf>,
    /// Every layer's k_norm, `[layers, head_dim]`.
    ctx_k_norm: CudaSlice<f32>,
    /// `CHUNK · layers · 2·kv` values: a chunk of context rows' keys and values, token-major after
    /// the stacked projection, layer-major after one a layer.
    ctx_out: CudaSlice<f32>,
    ctx_len: usize,
    scratch: Scratch,
    /// Host-fed feature rows (taken out while a chunk is projected from it).
    features: Option<CudaSlice<f32>>,
    /// The target's capture buffer, read directly when the loop hands over device rows.
    capture: SharedCapture,
    c: CudaSlice<f32>,
    x: CudaSlice<f32>,
    hidden: CudaSlice<f32>,
    /// The block's logits rows `[B, V]` and the slots' sampler states, in the slot the target's
    /// verify reads them from (a sampled block's q).
    rows: SharedDraftRows,
    /// `[first_pos, kv_len, anchor, mask × (B−1), pad, cfg × B]`: the step's [`StepLens`], for a
    /// proposal the block's ids, and for a sampled one each slot's sampler cfg words from
    /// [`cfg_at`].
    step_in: CudaSlice<u32>,
    /// The sampler's scratch for one slot's row at a time.
    sample: SampleScratch,
    /// Each slot's sampler out words `[m, token, overflow, row]` (4 · B).
    slot_out: CudaSlice<u32>,
    /// The B chosen tokens, in the buffer the target's verify reads them from.
    tokens: SharedTokens,
    /// Whether a sampled block is drawn on the device (tests turn it off to compare with the
    /// host reference, [`Drafter::propose_sampled`]).
    device_sampling: bool,
    /// Sampled blocks drawn wholly on the device so far (tests check the path ran).
    device_blocks: usize,
    graphs: StepGraphs<DraftStep>,
    e: CudaSlice<f32>,
    u: CudaSlice<f32>,
    conf_logits: CudaSlice<f32>,
    /// The GEMM path for context appends of more than [`CHUNK`] rows (a prompt's), planned when
    /// the target prefills on GEMMs.
    prefill: Option<DraftPrefill>,
    /// The target's prefill capture buffer, read directly for a prompt chunk's rows.
    prefill_capture: Option<SharedCapture>,
}

impl CudaDraft {
    pub fn config(&self) -> &DraftConfig {
        &self.cfg
    }

    /// Keeps context positions `0..len` (the draft-side rollback; the bench uses it to hold the
    /// context length fixed across timed rounds).
    pub fn truncate_context(&mut self, len: usize) -> Result<()> {
        if len > self.ctx_len {
            return Err(Error::Request(format!("cannot truncate a {}-position draft context to {len}", self.ctx_len)));
        }
        self.ctx_len = len;
        Ok(())
    }

    /// Bytes of weights the draft holds in mapped host memory, outside its arena (Markov W1
    /// under `--embeddings host`).
    pub fn host_bytes(&self) -> usize {
        match &self.markov {
            Some(Markov { w1: Table::Host(t), .. }) => t.bytes(),
            _ => 0,
        }
    }

    /// Bytes of the stacked copy of every layer's k|v rows (0 when the draft projects context
    /// rows a layer at a time, [`crate::cuda::prefill::CtxKv::Layers`]).
    pub fn ctx_kv_bytes(&self) -> usize {
        self.ctx_kv.as_ref().map_or(0, WeightBuf::bytes)
    }

    /// Bytes of the matrices one round streams: (fc, decoder layers, lm_head, Markov W2).
    /// W2 is read once per sequential Markov step, so a round streams it `block_size` times.
    pub fn matrix_bytes(&self) -> (usize, usize, usize, usize) {
        let layers = self.layers.iter().map(GpuLayer::matrix_bytes).sum();
        let w2 = self.markov.as_ref().map_or(0, |m| m.w2.bytes());
        (self.fc.bytes(), layers, self.lm_head.bytes(), w2)
    }

    /// Projects `n ≤ CHUNK` feature rows `[n, T·H]` into every layer's cache: the fused fc, the
    /// hidden norm, then one matvec over all layers' k|v rows (`ctx_kv`; or one a layer, over
    /// views of each layer's own rows, when the draft holds no stacked copy) and one fused
    /// norm + RoPE + append launch for all layers (`kv_layers.rs`). Context rows enter k/v
    /// directly: no input_layernorm (DSPARK.md §2.2). A few rows replay a CUDA graph.
    fn append_chunk(&mut self, features: &CudaView<f32>, n: usize) -> Result<()> {
        use cudarc::driver::DevicePtr;
        let gpu = self.gpu.clone();
        let first_pos = self.ctx_len;
        let lens = [first_pos as u32, (first_pos + n) as u32];
        // The copy also waits for every earlier kernel: the attention kernels rely on it to read
        // settled cache rows before their PDL wait (ARCHITECTURE.md).
        gpu.stream.memcpy_htod(&lens, &mut self.step_in.slice_mut(..2)).map_err(drv)?;
        let key =
            DraftStep::Append { rows: n, features: features.device_ptr(&gpu.stream).0, caches: self.caches.addr() };
        let mut graphs = std::mem::take(&mut self.graphs);
        let ran = graphs.run(&gpu, n, key, || self.launch_append(features, n, first_pos));
        self.graphs = graphs;
        ran?;
        self.ctx_len += n;
        Ok(())
    }

    fn launch_append(&mut self, features: &CudaView<f32>, n: usize, first_pos: usize) -> Result<()> {
        let l = &self.cfg.layer;
        let (h, t, kv, eps) = (l.hidden_size, self.cfg.num_taps(), l.kv_dim(), l.rms_norm_eps as f32);
        let gpu = self.gpu.clone();
        let lens = StepLens { dev: self.step_in.slice(..2), first_pos, kv_cap: first_pos + n };
        gpu.matvec(&self.fc, &features.slice(..n * t * h), &mut self.c.slice_mut(..n * h), (n, t * h, h), false)
            .map_err(gpu_err)?;
        gpu.rmsnorm(
            &self.c.slice(..n * h),
            &self.hidden_norm.as_view(),
            eps,
            n,
            &mut self.scratch.u.slice_mut(..n * h),
        )
        .map_err(gpu_err)?;
        // Every layer's keys and values of these rows: one projection (or one a layer), one append.
        let width = self.caches.layers() * 2 * kv;
        let u = GemmIn::F32(self.scratch.u.slice(..n * h));
        let ctx_kv = ctx_kv_of(&self.ctx_kv, &self.layers, l.q_dim());
        ctx_kv.project(&gpu, None, &u, &mut self.ctx_out.slice_mut(..n * width), (n, h, width))?;
        gpu.kv_rope_append_layers(
            &self.ctx_out.slice(..n * width),
            (&self.ctx_k_norm.as_view(), &self.inv_freq.as_view()),
            &mut self.caches,
            (n, l.num_key_value_heads),
            &lens,
            eps,
            ctx_kv.layout(),
        )
        .map_err(gpu_err)?;
        Ok(())
    }

    /// The launches of a proposal at context length `p` (block ids, and with [`Pick::Sample`]
    /// each slot's cfg words, already in `step_in`): the block forward and lm_head, the Markov
    /// chain slot by slot, and the confidence head.
    fn launch_propose(&mut self, p: usize, kv_cap: usize, pick: Pick) -> Result<()> {
        self.launch_block(p, kv_cap)?;
        let b = self.cfg.block_size;
        let shared = self.tokens.clone();
        let mut chosen = shared.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
        let rows = self.rows.clone();
        let mut rows = rows.lock().map_err(|_| Error::Request("draft rows poisoned".into()))?;
        let rows = rows.as_mut().ok_or_else(|| Error::Request("draft rows missing".into()))?;
        for s in 0..b {
            match pick {
                Pick::Argmax => self.slot_argmax(s, &mut chosen.data, &mut rows.logits)?,
                Pick::Sample(shape) => {
                    self.slot_logits(s, &mut rows.logits)?;
                    let gpu = self.gpu.clone();
                    let v = self.cfg.layer.vocab_size;
                    let cfg = self.step_in.slice(cfg_at(b) + s * CFG_WORDS..cfg_at(b) + (s + 1) * CFG_WORDS);
                    let io = SampleIo {
                        state: Some(rows.state.slice_mut(s * ROW_WORDS..(s + 1) * ROW_WORDS)),
                        q: None,
                        out: Some(self.slot_out.slice_mut(4 * s..4 * s + 4)),
                        token: Some(chosen.data.slice_mut(s..s + 1)),
                    };
                    let logits_s = rows.logits.slice(s * v..(s + 1) * v);
                    gpu.sample_rows(&logits_s, (1, v, v), &cfg, &cfg, shape, &mut self.sample, io).map_err(gpu_err)?;
                    self.gather_next(s, &chosen.data)?;
                }
            }
        }
        self.launch_confidence()
    }

    /// The block forward up to the final logits `[B, V]` (before any Markov bias), and the
    /// chain's start: the RNN state zeroed and e₀ = W1[anchor].
    fn launch_block(&mut self, p: usize, kv_cap: usize) -> Result<()> {
        let l = self.cfg.layer.clone();
        let (b, h, v, eps) = (self.cfg.block_size, l.hidden_size, l.vocab_size, l.rms_norm_eps as f32);
        let gpu = self.gpu.clone();
        let lens = StepLens { dev: self.step_in.slice(..2), first_pos: p, kv_cap };
        let ids = self.step_in.slice(2..2 + b);
        gpu.embedding(&*self.embed_tokens, h, &ids, b, &mut self.x.slice_mut(..b * h)).map_err(gpu_err)?;
        // The final norm runs on its own: the Markov chain and the confidence head read the
        // normalised rows too.
        let seg = Segment { start: 0, rows: b, lens, caches: self.caches.caches_mut() };
        run_layers(
            &gpu,
            &l,
            &self.layers,
            &mut self.scratch,
            &mut self.x.slice_mut(..b * h),
            (b, false),
            &self.inv_freq,
            &mut [seg],
            None,
            |_, _| Ok(()),
        )?;
        gpu.rmsnorm(&self.x.slice(..b * h), &self.norm.as_view(), eps, b, &mut self.hidden.slice_mut(..b * h))
            .map_err(gpu_err)?;
        let rows = self.rows.clone();
        let mut rows = rows.lock().map_err(|_| Error::Request("draft rows poisoned".into()))?;
        let rows = rows.as_mut().ok_or_else(|| Error::Request("draft rows missing".into()))?;
        let hidden = self.hidden.slice(..b * h);
        head_product(
            &gpu,
            &self.lm_head,
            &hidden,
            &mut self.scratch.half,
            &mut rows.logits.slice_mut(..b * v),
            (b, h, v),
        )?;
        // The sequential chain: slot s reads its previous token from device memory.
        if let Some(Markov { variant: Variant::Rnn { state, .. }, .. }) = &mut self.markov {
            gpu.stream.memset_zeros(state).map_err(drv)?;
        }
        // e holds every slot's W1 row: slot 0's is gathered here, slot s + 1's after slot s.
        if let Some(m) = &self.markov {
            let r = m.rank;
            gpu.gather_row(&m.w1, r, &ids.slice(0..1), &mut self.e.slice_mut(..r)).map_err(gpu_err)?;
        }
        Ok(())
    }

    /// Writes a proposal's step words (`[first_pos, kv_len, anchor, mask × (B−1)]`, then `cfg`)
    /// into `step_in`; the copy also waits for every earlier kernel, which the attention kernels
    /// rely on to read settled cache rows before their PDL wait (ARCHITECTURE.md).
    fn write_step(&mut self, anchor: u32, cfg: &[u32]) -> Result<()> {
        let (b, v) = (self.cfg.block_size, self.cfg.layer.vocab_size);
        if anchor as usize >= v {
            return Err(Error::Request(format!("anchor token {anchor} is outside the vocabulary ({v})")));
        }
        let p = self.ctx_len;
        let mut step = vec![self.cfg.mask_token_id; if cfg.is_empty() { 2 + b } else { cfg_at(b) }];
        step[0] = p as u32;
        step[1] = (p + b) as u32;
        step[2] = anchor;
        step.extend_from_slice(cfg);
        self.gpu.stream.memcpy_htod(&step, &mut self.step_in.slice_mut(..step.len())).map_err(drv)
    }

    /// Runs a proposal (its step words written) through the graph for its shape, and returns
    /// the handle of the tokens it left in the shared buffer.
    fn run_propose(&mut self, pick: Pick) -> Result<DeviceTokens> {
        use cudarc::driver::DevicePtr;
        let b = self.cfg.block_size;
        let gpu = self.gpu.clone();
        let p = self.ctx_len;
        let kv_cap = self.graphs.kv_cap(&gpu, b, p + b, self.max_len + b);
        let rows = {
            let r = self.rows.lock().map_err(|_| Error::Request("draft rows poisoned".into()))?;
            let addr = r.as_ref().map_or(0, |r| r.logits.device_ptr(&gpu.stream).0);
            addr
        };
        let sample = match pick {
            Pick::Argmax => None,
            Pick::Sample(shape) => Some(shape),
        };
        let mut graphs = std::mem::take(&mut self.graphs);
        let key = DraftStep::Propose { kv_cap, sample, rows, caches: self.caches.addr() };
        let ran = graphs.run(&gpu, b, key, || self.launch_propose(p, kv_cap, pick));
        self.graphs = graphs;
        ran?;
        let generation = {
            let mut t = self.tokens.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
            t.generation += 1;
            t.generation
        };
        Ok(DeviceTokens { buffer: handoff_id(&self.tokens), generation, len: b, sampled: sample.is_some() })
    }

    /// The prefix survival of the last proposal (from the confidence logits), when the draft has
    /// a confidence head.
    fn survival(&self) -> Result<Option<Vec<f32>>> {
        if self.confidence.is_none() {
            return Ok(None);
        }
        let b = self.cfg.block_size;
        let mut logits = vec![0f32; b];
        self.gpu.stream.memcpy_dtoh(&self.conf_logits.slice(..b), &mut logits).map_err(drv)?;
        Ok(Some(prefix_survival(&logits)))
    }

    /// Turns CUDA graphs on or off for later steps (tests compare both paths).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set_enabled(on);
    }

    /// Turns the device sampler of sampled blocks on or off: off, every sampled block is drawn
    /// by the host reference (tests compare both paths).
    pub fn set_device_sampling(&mut self, on: bool) {
        self.device_sampling = on;
    }

    /// How many sampled blocks were drawn wholly on the device (none sent to the host path).
    pub fn sampled_on_device(&self) -> usize {
        self.device_blocks
    }

    /// Refuses a context past `max_len`; on paged contexts, maps the pages `n` more rows and
    /// the block after them take (`paged.rs`).
    fn check_room(&mut self, n: usize) -> Result<()> {
        if self.ctx_len + n > self.max_len {
            return Err(Error::Request(format!(
                "draft context of {} positions exceeds {}",
                self.ctx_len + n,
                self.max_len
            )));
        }
        let positions = self.ctx_len + n + self.cfg.block_size;
        Self::cover_ctx(&mut self.ctx_pages, &mut self.caches, positions)
    }
}

/// Where the slots' sampler cfg words start in a draft's `step_in` (after the `2 + B` step
/// words): a multiple of four words, because a `SampleCfg` holds f64 uniforms (and B = 7, the
/// published draft's block, would put them at an odd word otherwise: a misaligned address).
fn cfg_at(block: usize) -> usize {
    (2 + block).next_multiple_of(4)
}
