//! `CudaQwen3`'s side of the GEMM prefill: which forwards take it, the chunk loop, one chunk's
//! embedding, layers (crate::cuda::prefill), final norm and logits, and the captures handed to
//! a draft.

use super::{CudaQwen3, SharedCapture, CHUNK};
use crate::backend::LogitRows;
use crate::checkpoint::config::Qwen3Config;
use crate::cuda::layers::{drv, gpu_err};
use crate::cuda::plan::TargetPlan;
use crate::cuda::prefill::{Prefill, PrefillMode};
use crate::error::Result;
use dspark_kernels::cuda::kv::KvDtype;
use dspark_kernels::cuda::norm_fold::Normed;
use dspark_kernels::cuda::ops::StepLens;
use std::sync::Arc;

/// What a prefill returns to the host: logits rows or their argmax ids, and the captures.
#[derive(Default)]
pub(super) struct PrefillOut {
    pub(super) logits: Vec<f32>,
    pub(super) rows: usize,
    pub(super) ids: Vec<u32>,
    pub(super) captured: Vec<f32>,
}

impl CudaQwen3 {
    /// The prefill's capture buffer, which a draft on this target reads a prompt chunk's rows
    /// from (`None` when prompts take the small-M path).
    pub fn shared_prefill_capture(&self) -> Option<SharedCapture> {
        match self.prefill_mode {
            PrefillMode::Gemm => self.prefill.as_ref().map(|p| p.captured.clone()),
            PrefillMode::Exact => None,
        }
    }

    /// The prefill's cuBLAS handle and mode, for a draft loaded onto this target (`None` when
    /// prompts take the small-M path).
    pub fn prefill_blas(&self) -> Option<Arc<dspark_kernels::cuda::gemm::Blas>> {
        match self.prefill_mode {
            PrefillMode::Gemm => self.prefill.as_ref().map(Prefill::blas),
            PrefillMode::Exact => None,
        }
    }

    /// Rows of the GEMM prefill's planned chunk (0 when every forward takes the small-M path).
    pub fn prefill_rows(&self) -> usize {
        self.prefill.as_ref().map_or(0, |p| p.rows)
    }

    /// Chooses how forwards of more than [`CHUNK`] rows run (`--prefill`).
    pub fn set_prefill(&mut self, mode: PrefillMode) {
        self.prefill_mode = mode;
    }

    /// Sets which forwards take the GEMM prefill (those of more than `after` tokens, at least
    /// one) and its chunk size (capped at the planned rows); tests use it to send short
    /// prompts and several chunks through the GEMM path.
    pub fn set_prefill_shape(&mut self, after: usize, chunk: usize) {
        self.prefill_after = after.max(1);
        self.prefill_cap = chunk.max(1);
    }

    /// Whether a forward of `n` tokens takes the GEMM prefill.
    pub(super) fn gemm_prefill(&self, n: usize) -> bool {
        n > self.prefill_after && self.prefill.is_some() && self.prefill_mode == PrefillMode::Gemm
    }

    /// A forward of `tokens` on the GEMM path, in chunks of up to the prefill's rows: logits of
    /// `rows` (as ids with `argmax`) and every row's captures, to the host.
    pub(super) fn forward_prefill(&mut self, tokens: &[u32], rows: LogitRows, argmax: bool) -> Result<PrefillOut> {
        let step = self.prefill.as_ref().map_or(CHUNK, |p| p.rows).min(self.prefill_cap);
        let chunks: Vec<&[u32]> = tokens.chunks(step).collect();
        let last = chunks.len() - 1;
        let mut out = PrefillOut::default();
        // One chunk's captures stay on the device for the draft (`Captured::Device`); several
        // chunks' go to the host, since each chunk overwrites the buffer.
        let to_host = !(argmax && last == 0);
        for (i, chunk) in chunks.into_iter().enumerate() {
            let from = Self::logit_from(rows, i, last, chunk.len());
            self.run_prefill_chunk(chunk, from, (argmax, to_host), &mut out)?;
        }
        Ok(out)
    }

    /// One chunk of the GEMM prefill (see [`crate::cuda::prefill`]).
    fn run_prefill_chunk(
        &mut self,
        chunk: &[u32],
        logit_from: Option<usize>,
        (argmax, to_host): (bool, bool),
        out: &mut PrefillOut,
    ) -> Result<()> {
        let n = chunk.len();
        let gpu = self.gpu.clone();
        let (h, v, eps) = (self.cfg.hidden_size, self.cfg.vocab_size, self.cfg.rms_norm_eps as f32);
        let Some(pf) = self.prefill.as_mut() else {
            return Err(crate::error::Error::Request("the GEMM prefill was not planned for this model".into()));
        };
        if n > pf.rows {
            return Err(crate::error::Error::Request(format!("prefill chunk of {n} rows, planned for {}", pf.rows)));
        }
        let (first_pos, kv_len) = (self.len, self.len + n);
        let mut up = Vec::with_capacity(2 + n);
        up.extend_from_slice(&[first_pos as u32, kv_len as u32]);
        up.extend_from_slice(chunk);
        gpu.stream.memcpy_htod(&up, &mut self.prefill_in.slice_mut(..2 + n)).map_err(drv)?;
        let lens = StepLens { dev: self.prefill_in.slice(..2), first_pos, kv_cap: kv_len };
        gpu.embedding(&*self.embed_tokens, h, &self.prefill_in.slice(2..2 + n), n, &mut pf.x.slice_mut(..n * h))
            .map_err(gpu_err)?;
        pf.run_layers(
            &gpu,
            &self.cfg,
            &self.layers,
            n,
            &lens,
            &self.inv_freq,
            self.caches.layers_mut(),
            &self.capture,
        )?;
        if let Some(from) = logit_from {
            let head = &self.lm_head;
            let s = &mut self.scratch;
            // The final norm and the output head, CHUNK rows at a time into the decode buffers.
            for start in (from..n).step_by(CHUNK) {
                let rows = (n - start).min(CHUNK);
                let x = pf.x.slice(start * h..(start + rows) * h);
                gpu.rmsnorm(&x, &self.norm.as_view(), eps, rows, &mut s.u.slice_mut(..rows * h)).map_err(gpu_err)?;
                gpu.matvec_normed(
                    head,
                    &mut s.u.slice_mut(..rows * h),
                    Normed::Done,
                    &s.ss.slice(..0),
                    &mut self.logits.slice_mut(..rows * v),
                    (rows, h, v),
                    false,
                )
                .map_err(gpu_err)?;
                if let (true, Some((_, shape)), 1) = (argmax, &self.prefill_sample, rows) {
                    let shape = *shape;
                    // A sampled prefill: the last row's token from the device sampler (its cfg
                    // words are already in step_in; see `sampled.rs`).
                    let cfg = self.step_in.slice(2 + CHUNK..);
                    let drafts = self.step_in.slice(3..4);
                    gpu.sample_verify(&self.logits.slice(..v), (1, v, v), &cfg, &drafts, shape, &mut self.sample)
                        .map_err(gpu_err)?;
                    out.ids.push(u32::MAX);
                } else if argmax {
                    let logits = self.logits.slice(..rows * v);
                    gpu.argmax_split(&logits, v, v, rows, &mut self.next_ids.slice_mut(..rows), &mut s.ops)
                        .map_err(gpu_err)?;
                    let mut ids = vec![0u32; rows];
                    gpu.stream.memcpy_dtoh(&self.next_ids.slice(..rows), &mut ids).map_err(drv)?;
                    out.ids.extend_from_slice(&ids);
                } else {
                    let mut host = vec![0f32; rows * v];
                    gpu.stream.memcpy_dtoh(&self.logits.slice(..rows * v), &mut host).map_err(drv)?;
                    out.logits.extend_from_slice(&host);
                }
                out.rows += rows;
            }
        }
        let row = self.capture.len() * h;
        if row > 0 && to_host {
            let mut host = vec![0f32; n * row];
            let cap = crate::cuda::prefill::lock(&pf.captured)?;
            gpu.stream.memcpy_dtoh(&cap.data.slice(..n * row), &mut host).map_err(drv)?;
            out.captured.extend_from_slice(&host);
        }
        self.len += n;
        Ok(())
    }

    /// Device bytes a target of `cfg` plans beyond its weights for `max_len` positions of `kv`
    /// caches, with the default plan ([`TargetPlan::device_bytes`]).
    pub fn planned_bytes(cfg: &Qwen3Config, max_len: usize, kv: KvDtype) -> usize {
        TargetPlan::new(max_len, kv).device_bytes(cfg)
    }
}
