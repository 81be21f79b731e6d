//! The Qwen3 target on the GPU, behind the same [`TargetModel`] trait as the CPU reference.
//!
//! Everything is planned at load: weights in their checkpoint dtype, the KV cache for
//! `max_len` positions, and activation buffers for steps of up to [`CHUNK`] rows. A forward
//! over more tokens (prefill) runs as consecutive chunks, each a causal step over the cache, so
//! no step allocates device memory.
//!
//! Two ways out: [`TargetModel::forward`] copies logits and captures to the host (tests, tools);
//! [`TargetModel::forward_greedy`], which the decoding loops use, takes the argmax of each row on
//! the device and copies back only the ids, and leaves the captured layer outputs of a forward
//! of at most [`CHUNK`] tokens in a device buffer shared with the draft ([`SharedCapture`]), so
//! a speculative round moves no activations through the host.

use crate::backend::{
    check_capture, check_forward, check_truncate, prefill_sampled_on_host, verify_on_host, Captured, Deferred,
    DeviceRows, Filters, Forward, Greedy, LogitRows, SampledVerify, TargetModel,
};
use crate::checkpoint::config::Qwen3Config;
use crate::cuda::graphs::StepGraphs;
use crate::cuda::layers::{capture_layer, drv, gpu_err, run_layers, GpuLayer, Scratch, Segment};
use crate::cuda::layers_gemm::{head_product, runs_on_row_gemms};
use crate::cuda::prefill::{Prefill, PrefillMode};

mod batch;
mod build;
mod prefill;
mod sampled;
use crate::error::Result;
pub use batch::CudaBatch;
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::host_table::Table;
use dspark_kernels::cuda::kv::{KvCaches, KvDtype};
use dspark_kernels::cuda::norm_fold::Normed;
use dspark_kernels::cuda::ops::{StepLens, WeightBuf};
use dspark_kernels::cuda::sample::{SampleIo, SampleScratch, SampleShape, CFG_WORDS};
use dspark_kernels::cuda::Gpu;
use dspark_tensor::arena::Arena;
pub(crate) use sampled::plan as plan_sample;
use std::sync::Arc;

use super::handoff::{handoff_id, Handoff, SharedCapture, SharedDraftRows, SharedTokens};

/// Most rows one device step processes (prefill runs in chunks of this size).
pub const CHUNK: usize = 64;

/// A step's graph key: (rows, first logits row, attention key capacity, argmax, sampler phases
/// and the address of the draft rows it judges against, 0 for one-hot drafts, the K/V caches'
/// address — caches are swapped per sequence in a batch).
type StepKey = (usize, Option<usize>, usize, bool, Option<(SampleShape, u64)>, u64);

/// A Qwen3 target on one GPU.
pub struct CudaQwen3 {
    pub gpu: Arc<Gpu>,
    pub arena: Arena,
    cfg: Qwen3Config,
    max_len: usize,
    /// On the device, or in mapped host memory ([`Embeddings`]).
    pub(crate) embed_tokens: Arc<Table>,
    /// The output head: `embed_tokens`' buffer when tied.
    pub(crate) lm_head: Arc<WeightBuf>,
    layers: Vec<GpuLayer>,
    norm: CudaSlice<f32>,
    inv_freq: CudaSlice<f32>,
    /// Every layer's K and V cache, f32 or bf16 ([`KvDtype`]).
    caches: KvCaches,
    len: usize,
    capture: Vec<usize>,
    scratch: Scratch,
    /// `[first_pos, kv_len, ids… (CHUNK), sampler cfg]` of the step being run ([`StepLens`], the
    /// embedding's ids, and a sampled verify's filters and uniforms).
    step_in: CudaSlice<u32>,
    /// CUDA graphs by (rows, first logits row, attention key capacity, argmax, sampler phases).
    graphs: StepGraphs<StepKey>,
    /// The device sampler's scratch (`cuda::qwen3::sampled`), and whether sampled verifies use
    /// it (off: the logits go to the host, the reference path the GPU tests compare against).
    sample: SampleScratch,
    device_sampling: bool,
    /// Set while a sampled prefill runs: its last row goes through the sampler with these cfg
    /// words (`sampled.rs`).
    prefill_sample: Option<(Vec<u32>, SampleShape)>,
    x: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    /// Argmax ids of the logits rows.
    next_ids: CudaSlice<u32>,
    pub(crate) captured: SharedCapture,
    pub(crate) drafted: SharedTokens,
    pub(crate) draft_rows: SharedDraftRows,
    /// The GEMM path for forwards of more than [`CHUNK`] rows (`None` when `max_len` ≤ CHUNK).
    prefill: Option<Prefill>,
    /// `[first_pos, kv_len, ids…]` of a prefill chunk.
    prefill_in: CudaSlice<u32>,
    prefill_mode: PrefillMode,
    /// Forwards of more than this many tokens take the GEMM prefill ([`CHUNK`] by default).
    prefill_after: usize,
    /// Rows of one prefill chunk (at most the planned [`Prefill::rows`]).
    prefill_cap: usize,
}

impl CudaQwen3 {
    /// The KV caches' element type.
    pub fn kv_dtype(&self) -> KvDtype {
        self.caches.dtype()
    }

    /// Bytes of weights held in mapped host memory (`--embeddings host`), outside the arena.
    pub fn host_bytes(&self) -> usize {
        self.embed_tokens.bytes() - self.embed_tokens.device_bytes()
    }

    /// Bytes of weights a forward streams (every matrix once; the embedding is gathered).
    pub fn streamed_weight_bytes(&self) -> usize {
        self.lm_head.bytes() + self.layers.iter().map(GpuLayer::matrix_bytes).sum::<usize>()
    }

    /// Turns the device sampler on or off for later sampled verifies (tests compare both paths).
    pub fn set_device_sampling(&mut self, on: bool) {
        self.device_sampling = on;
    }

    /// Turns CUDA graphs on or off for later steps (tests compare both paths).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.set_enabled(on);
    }

    /// The draft-token buffer shared with drafts loaded onto this target's GPU.
    pub fn shared_tokens(&self) -> SharedTokens {
        self.drafted.clone()
    }

    /// The slot a sampled draft installs its rows in (see [`DraftRows`]).
    pub fn shared_draft_rows(&self) -> SharedDraftRows {
        self.draft_rows.clone()
    }

    /// The capture buffer shared with drafts loaded onto this target's GPU.
    pub fn shared_capture(&self) -> SharedCapture {
        self.captured.clone()
    }

    /// Runs one chunk of at most [`CHUNK`] tokens on the device: logits of rows `from..` into
    /// `self.logits` (none when `logit_from` is `None`) and with `argmax` their ids into
    /// `self.next_ids`, captures into the shared buffer's first `n` rows. Returns the number of
    /// logits rows. Steps of a few rows replay a CUDA graph (`cuda::graphs`). The chunk's tokens
    /// are `host` followed by the first `drafted` tokens of the shared draft-token buffer, copied
    /// on the device (the verify of a deferred proposal).
    fn run_step(&mut self, host: &[u32], drafted: usize, logit_from: Option<usize>, argmax: bool) -> Result<usize> {
        // A sampled prefill's last row: the sampler instead of the argmax.
        if let (true, Some(from), Some((words, shape))) = (argmax, logit_from, self.prefill_sample.take()) {
            let ran = if host.len() + drafted == from + 1 {
                Some(self.run_step_with(host, drafted, logit_from, false, Some((&words, shape, false))))
            } else {
                None
            };
            self.prefill_sample = Some((words, shape));
            if let Some(r) = ran {
                return r;
            }
        }
        self.run_step_with(host, drafted, logit_from, argmax, None)
    }

    /// [`CudaQwen3::run_step`], and with `sample` (the sampler's cfg words, its phases, and
    /// whether the drafts are judged against the shared [`DraftRows`]) the logits rows go through
    /// the device sampler (`cuda::qwen3::sampled`).
    fn run_step_with(
        &mut self,
        host: &[u32],
        drafted: usize,
        logit_from: Option<usize>,
        argmax: bool,
        sample: Option<(&[u32], SampleShape, bool)>,
    ) -> Result<usize> {
        let n = host.len() + drafted;
        let gpu = self.gpu.clone();
        let (first_pos, kv_len) = (self.len, self.len + n);
        // The step's positions and token ids, in one copy: [first_pos, kv_len, ids…], and the
        // sampler's words after the id slots when it runs.
        let mut up = [0u32; 2 + CHUNK + CFG_WORDS];
        up[0] = first_pos as u32;
        up[1] = kv_len as u32;
        up[2..2 + host.len()].copy_from_slice(host);
        let m = 2 + host.len();
        if let Some((words, ..)) = sample {
            up[2 + CHUNK..].copy_from_slice(words);
        }
        let copied = if sample.is_some() { up.len() } else { m };
        // The copy also waits for every earlier kernel: the attention kernels rely on it to read
        // settled cache rows before their PDL wait (ARCHITECTURE.md).
        gpu.stream.memcpy_htod(&up[..copied], &mut self.step_in.slice_mut(..copied)).map_err(drv)?;
        if drafted > 0 {
            let shared = self.drafted.clone();
            let d = shared.lock().map_err(|_| crate::error::Error::Request("draft token buffer poisoned".into()))?;
            gpu.stream
                .memcpy_dtod(&d.data.slice(..drafted), &mut self.step_in.slice_mut(m..m + drafted))
                .map_err(drv)?;
        }
        let kv_cap = self.graphs.kv_cap(&gpu, n, kv_len, self.max_len);
        let shared = self.captured.clone();
        shared.lock().map_err(|_| crate::error::Error::Request("capture buffer poisoned".into()))?.generation += 1;
        let mut graphs = std::mem::take(&mut self.graphs);
        let shape = match sample {
            Some((_, shape, true)) => Some((shape, self.draft_rows_addr()?)),
            Some((_, shape, false)) => Some((shape, 0)),
            None => None,
        };
        let key = (n, logit_from, kv_cap, argmax, shape, self.caches.addr(&gpu));
        let ran = graphs.run(&gpu, n, key, || self.launch_step(n, (first_pos, kv_cap), logit_from, argmax, shape));
        self.graphs = graphs;
        ran?;
        self.len += n;
        Ok(logit_from.map_or(0, |from| n - from))
    }

    /// The launches of one step over `n` rows whose positions and ids are in `self.step_in`
    /// (the host's `first_pos` and `kv_cap` only check shapes and size the attention grid).
    fn launch_step(
        &mut self,
        n: usize,
        (first_pos, kv_cap): (usize, usize),
        logit_from: Option<usize>,
        argmax: bool,
        sample: Option<(SampleShape, u64)>,
    ) -> Result<()> {
        let c = &self.cfg;
        let (h, v) = (c.hidden_size, c.vocab_size);
        let gpu = self.gpu.clone();
        let lens = StepLens { dev: self.step_in.slice(..2), first_pos, kv_cap };
        gpu.embedding(&*self.embed_tokens, h, &self.step_in.slice(2..2 + n), n, &mut self.x.slice_mut(..n * h))
            .map_err(gpu_err)?;
        let shared = self.captured.clone();
        let mut cap = shared.lock().map_err(|_| crate::error::Error::Request("capture buffer poisoned".into()))?;
        // The last layer's `down` also leaves the final norm when logits are wanted.
        let capture = &self.capture;
        let seg = Segment { start: 0, rows: n, lens, caches: self.caches.layers_mut() };
        let normed = run_layers(
            &gpu,
            c,
            &self.layers,
            &mut self.scratch,
            &mut self.x.slice_mut(..n * h),
            (n, true),
            &self.inv_freq,
            &mut [seg],
            logit_from.map(|_| &self.norm),
            |l, x| capture_layer(&gpu, capture, l, &x.as_view(), (n, h), &mut cap.data),
        )?;
        let Some(from) = logit_from else { return Ok(()) };
        drop(cap);
        let rows = self.head_logits(normed, from, n)?;
        let s = &mut self.scratch;
        if argmax {
            let logits = self.logits.slice(..rows * v);
            gpu.argmax_split(&logits, v, v, rows, &mut self.next_ids.slice_mut(..rows), &mut s.ops).map_err(gpu_err)?;
        }
        if let Some((shape, q)) = sample {
            // The drafts are the step's ids after the anchor; a plain step (one row) has none.
            let drafts = self.step_in.slice(3..3 + rows.max(2) - 1);
            let cfg = self.step_in.slice(2 + CHUNK..);
            let logits = self.logits.slice(..rows * v);
            let shared = self.draft_rows.clone();
            let rows_q = shared.lock().map_err(|_| crate::error::Error::Request("draft rows poisoned".into()))?;
            let io = match (&*rows_q, q) {
                (Some(d), q) if q != 0 => {
                    SampleIo { q: Some((d.logits.as_view(), v, d.state.as_view())), ..Default::default() }
                }
                (_, 0) => SampleIo::default(),
                _ => return Err(crate::error::Error::Request("no draft rows to judge a sampled block against".into())),
            };
            gpu.sample_rows(&logits, (rows, v, v), &cfg, &drafts, shape, &mut self.sample, io).map_err(gpu_err)?;
        }
        Ok(())
    }

    /// Whether the layers run on the bf16 mode's row GEMMs (`layers_gemm.rs`).
    pub fn runs_on_row_gemms(&self) -> bool {
        runs_on_row_gemms(&self.gpu, &self.cfg, &self.layers)
    }

    /// Logits of rows `from..n` into `self.logits` from what the last layer's `down` left (the
    /// final norm of all n rows in `scratch`); returns how many rows.
    fn head_logits(&mut self, normed: Option<Normed>, from: usize, n: usize) -> Result<usize> {
        let (h, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let rows = n - from;
        let normed = normed.unwrap_or(Normed::Done);
        let parts = normed.parts();
        let s = &mut self.scratch;
        if normed == Normed::Done && runs_on_row_gemms(&self.gpu, &self.cfg, &self.layers) {
            let x = s.u.slice(from * h..n * h);
            let mut y = self.logits.slice_mut(..rows * v);
            head_product(&self.gpu, &self.lm_head, &x, &mut s.half, &mut y, (rows, h, v))?;
            return Ok(rows);
        }
        self.gpu
            .matvec_normed(
                &self.lm_head,
                &mut s.u.slice_mut(from * h..n * h),
                normed,
                &s.ss.slice(from * parts..n * parts),
                &mut self.logits.slice_mut(..rows * v),
                (rows, h, v),
                false,
            )
            .map_err(gpu_err)?;
        Ok(rows)
    }

    /// The device address of the installed [`DraftRows`]' logits (part of a graph's key, so a
    /// draft loaded later with other buffers gets graphs of its own).
    fn draft_rows_addr(&self) -> Result<u64> {
        use cudarc::driver::DevicePtr;
        let rows = self.draft_rows.lock().map_err(|_| crate::error::Error::Request("draft rows poisoned".into()))?;
        let d = rows.as_ref().ok_or_else(|| crate::error::Error::Request("no draft rows installed".into()))?;
        let addr = d.logits.device_ptr(&self.gpu.stream).0;
        Ok(addr)
    }

    /// Copies the first `n` capture rows to the host, appending to `out`.
    fn captured_to_host(&self, n: usize, out: &mut Vec<f32>) -> Result<()> {
        let row = self.capture.len() * self.cfg.hidden_size;
        if row == 0 {
            return Ok(());
        }
        let cap = self.captured.lock().map_err(|_| crate::error::Error::Request("capture buffer poisoned".into()))?;
        let mut host = vec![0f32; n * row];
        self.gpu.stream.memcpy_dtoh(&cap.data.slice(..n * row), &mut host).map_err(drv)?;
        out.extend_from_slice(&host);
        Ok(())
    }

    /// Which rows of chunk `i` of `last` need logits.
    fn logit_from(rows: LogitRows, i: usize, last: usize, len: usize) -> Option<usize> {
        match rows {
            LogitRows::All => Some(0),
            LogitRows::Last if i == last => Some(len - 1),
            LogitRows::Last => None,
        }
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

    fn prefill_chunk(&self) -> usize {
        match (&self.prefill, self.prefill_mode) {
            (Some(p), PrefillMode::Gemm) => p.rows.min(self.prefill_cap),
            _ => usize::MAX,
        }
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
        // Captured graphs hold the old capture list and buffer.
        self.graphs.clear();
        let need = CHUNK * layers.len() * self.cfg.hidden_size;
        let mut cap =
            self.captured.lock().map_err(|_| crate::error::Error::Request("capture buffer poisoned".into()))?;
        if cap.data.len() < need {
            // Planned once, when the draft is attached, never while decoding.
            cap.data = self.arena.zeros::<f32>(need).map_err(drv)?;
        }
        drop(cap);
        if let Some(pf) = self.prefill.as_mut() {
            pf.plan_capture(&self.arena, &self.cfg, layers.len())?;
        }
        Ok(())
    }

    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward> {
        check_forward(&self.cfg, self.len, self.max_len, tokens)?;
        if self.gemm_prefill(tokens.len()) {
            let p = self.forward_prefill(tokens, rows, false)?;
            return Ok(Forward { logits: p.logits, rows: p.rows, captured: p.captured });
        }
        let v = self.cfg.vocab_size;
        let mut out = Forward::default();
        let chunks: Vec<&[u32]> = tokens.chunks(CHUNK).collect();
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let n = self.run_step(chunk, 0, Self::logit_from(rows, i, last, chunk.len()), false)?;
            if n > 0 {
                let mut host = vec![0f32; n * v];
                self.gpu.stream.memcpy_dtoh(&self.logits.slice(..n * v), &mut host).map_err(drv)?;
                out.logits.extend_from_slice(&host);
                out.rows += n;
            }
            self.captured_to_host(chunk.len(), &mut out.captured)?;
        }
        Ok(out)
    }

    fn forward_greedy(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Greedy> {
        check_forward(&self.cfg, self.len, self.max_len, tokens)?;
        if self.gemm_prefill(tokens.len()) {
            let p = self.forward_prefill(tokens, rows, true)?;
            let step = self.prefill.as_ref().map_or(CHUNK, |p| p.rows).min(self.prefill_cap);
            let captured = match (&self.prefill, tokens.len() <= step && !self.capture.is_empty()) {
                (Some(pf), true) => {
                    let generation = crate::cuda::prefill::lock(&pf.captured)?.generation;
                    Captured::Device(DeviceRows {
                        buffer: handoff_id(&pf.captured),
                        generation,
                        first: 0,
                        rows: tokens.len(),
                    })
                }
                _ => Captured::Host(p.captured),
            };
            return Ok(Greedy { ids: p.ids, captured });
        }
        let chunks: Vec<&[u32]> = tokens.chunks(CHUNK).collect();
        let last = chunks.len() - 1;
        let mut ids = Vec::new();
        let mut host_captured = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let n = self.run_step(chunk, 0, Self::logit_from(rows, i, last, chunk.len()), true)?;
            if n > 0 {
                let gpu = self.gpu.clone();
                let mut host = vec![0u32; n];
                gpu.stream.memcpy_dtoh(&self.next_ids.slice(..n), &mut host).map_err(drv)?;
                ids.extend_from_slice(&host);
            }
            if last > 0 {
                self.captured_to_host(chunk.len(), &mut host_captured)?;
            }
        }
        let captured = if last > 0 { Captured::Host(host_captured) } else { self.device_captures(tokens.len())? };
        Ok(Greedy { ids, captured })
    }

    fn verify_greedy(&mut self, anchor: u32, drafts: &Deferred, k: usize) -> Result<Greedy> {
        let Deferred::OnDevice(d) = drafts else {
            return verify_on_host(self, anchor, drafts, k);
        };
        let current = {
            let t =
                self.drafted.lock().map_err(|_| crate::error::Error::Request("draft token buffer poisoned".into()))?;
            (handoff_id(&self.drafted), t.generation)
        };
        if (d.buffer, d.generation) != current || k > d.len || k + 1 > CHUNK {
            return Err(crate::error::Error::Request(
                "device draft tokens are stale, from another target, or more than the proposal holds".into(),
            ));
        }
        // The drafts were checked against the vocabulary by the draft's argmax; the anchor here.
        check_forward(&self.cfg, self.len, self.max_len.saturating_sub(k), &[anchor])?;
        let n = self.run_step(&[anchor], k, Some(0), true)?;
        let mut ids = vec![0u32; n];
        self.gpu.stream.memcpy_dtoh(&self.next_ids.slice(..n), &mut ids).map_err(drv)?;
        Ok(Greedy { ids, captured: self.device_captures(k + 1)? })
    }

    fn verify_sampled(
        &mut self,
        anchor: u32,
        drafts: &Deferred,
        k: usize,
        filters: &Filters,
        uniforms: &[f64],
    ) -> Result<SampledVerify> {
        if !self.device_sampling {
            return self.verify_sampled_host(anchor, drafts, k);
        }
        self.verify_sampled_device(anchor, drafts, k, filters, uniforms)
    }

    fn prefill_sampled(&mut self, tokens: &[u32], filters: &Filters, uniform: f64) -> Result<(u32, Captured)> {
        if !self.device_sampling {
            return prefill_sampled_on_host(self, tokens, filters, uniform);
        }
        self.prefill_sampled_device(tokens, filters, uniform)
    }
}

impl CudaQwen3 {
    /// The handle to the first `rows` rows of this forward's device captures (host-empty when
    /// nothing is captured).
    fn device_captures(&self, rows: usize) -> Result<Captured> {
        if self.capture.is_empty() {
            return Ok(Captured::Host(Vec::new()));
        }
        let generation = self
            .captured
            .lock()
            .map_err(|_| crate::error::Error::Request("capture buffer poisoned".into()))?
            .generation;
        Ok(Captured::Device(DeviceRows { buffer: handoff_id(&self.captured), generation, first: 0, rows }))
    }
}
