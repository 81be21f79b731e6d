//! The CUDA target's sampled verify: the step's logits rows go through the device sampler
//! (kernels/sample.cu) inside the same launch sequence — and the same CUDA graph — as the
//! forward, so a sampled round moves four words to the host, like a greedy one moves its argmax
//! ids. The filters and the round's uniforms ride in the step's one input copy (`step_in` after
//! the id slots), so a replayed graph reads each round's own.
//!
//! The device's answer equals the host rule's bit for bit (GPU tier: `gpu_kernels::sample`),
//! so when it cannot finish — top-p wanting more candidates than it holds — the logits come to
//! the host and the loop's host rule decides the same round the same way.

use super::{CudaQwen3, CHUNK};
use crate::backend::{
    check_forward, Captured, Deferred, Filters, LogitRows, SampledVerify, TargetModel, VerifyOutcome,
};
use crate::cuda::graphs::MAX_GRAPH_ROWS;
use crate::cuda::layers::drv;
use crate::error::{Error, Result};
use dspark_kernels::cpu::sample::{draw, transform};
use dspark_kernels::cuda::sample::{sample_cfg, SampleScratch, SampleShape, CFG_WORDS, MAX_UNIFORMS};
use dspark_tensor::arena::Arena;

/// Rows a device-sampled verify takes (a block of up to 15 drafts and its anchor).
pub(super) const SAMPLE_ROWS: usize = MAX_GRAPH_ROWS;

/// The sampler's buffers for `rows` rows of `vocab`, planned at load (the target's verify, or a
/// draft's slot at a time).
pub(crate) fn plan(arena: &Arena, rows: usize, vocab: usize) -> Result<SampleScratch> {
    let z = SampleScratch::sizes(rows, vocab);
    Ok(SampleScratch {
        rows,
        blocks: z.blocks,
        state: arena.zeros(z.state).map_err(drv)?,
        part_f: arena.zeros(z.part_f).map_err(drv)?,
        part_u: arena.zeros(z.part_u).map_err(drv)?,
        part_d: arena.zeros(z.part_d).map_err(drv)?,
        cands: arena.zeros(z.cands).map_err(drv)?,
        tickets: arena.zeros(z.tickets).map_err(drv)?,
        out: arena.zeros(z.out).map_err(drv)?,
    })
}

impl CudaQwen3 {
    /// [`TargetModel::verify_sampled`] on the device.
    pub(super) fn verify_sampled_device(
        &mut self,
        anchor: u32,
        drafts: &Deferred,
        k: usize,
        filters: &Filters,
        uniforms: &[f64],
    ) -> Result<SampledVerify> {
        if uniforms.len() != k + 1 {
            return Err(Error::Request(format!(
                "a sampled verify of {k} drafts takes {} uniforms, got {}",
                k + 1,
                uniforms.len()
            )));
        }
        let rows = k + 1;
        let (host, drafted, q): (Vec<u32>, usize, bool) = match drafts {
            Deferred::OnDevice(d) => {
                let current = {
                    let t = self.drafted.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
                    (super::handoff_id(&self.drafted), t.generation)
                };
                if (d.buffer, d.generation) != current || k > d.len {
                    return Err(Error::Request(
                        "device draft tokens are stale, from another target, or fewer than the verify needs".into(),
                    ));
                }
                (vec![anchor], k, d.sampled && k > 0)
            }
            Deferred::Ready(p) => {
                if k > p.tokens.len() {
                    return Err(Error::Request(format!("verify of {k} drafts, the proposal has {}", p.tokens.len())));
                }
                let mut v = vec![anchor];
                v.extend_from_slice(&p.tokens[..k]);
                check_forward(&self.cfg, self.len, self.max_len, &v)?;
                (v, 0, false)
            }
        };
        check_forward(&self.cfg, self.len, self.max_len.saturating_sub(k), &[anchor])?;
        if rows > SAMPLE_ROWS.min(MAX_UNIFORMS).min(CHUNK) {
            return Err(Error::Request(format!("a sampled verify takes at most {} rows, got {rows}", SAMPLE_ROWS)));
        }
        let v = self.cfg.vocab_size;
        let words = sample_cfg(filters, k, uniforms);
        let shape = SampleShape::of(filters, v);
        let n = self.run_step_with(&host, drafted, Some(0), false, Some((&words, shape, q)))?;
        let out = self.gpu.sample_result(&self.sample).map_err(crate::cuda::layers::gpu_err)?;
        let captured = self.device_captures(rows)?;
        if out[2] != 0 {
            let mut logits = vec![0f32; n * v];
            self.gpu.stream.memcpy_dtoh(&self.logits.slice(..n * v), &mut logits).map_err(drv)?;
            return Ok(SampledVerify { outcome: VerifyOutcome::Logits(logits), captured });
        }
        let accepted = out[0] as usize;
        if accepted > k || out[1] as usize >= v {
            return Err(Error::Request(format!("the device sampler answered {out:?} for {k} drafts")));
        }
        Ok(SampledVerify { outcome: VerifyOutcome::Drawn { accepted, next: out[1] }, captured })
    }

    /// The reference path of a sampled verify: every row's logits to the host (device drafts
    /// copied up first), for the caller's host rule.
    pub(super) fn verify_sampled_host(&mut self, anchor: u32, drafts: &Deferred, k: usize) -> Result<SampledVerify> {
        let mut input = vec![anchor];
        match drafts {
            Deferred::Ready(p) if k <= p.tokens.len() => input.extend_from_slice(&p.tokens[..k]),
            Deferred::OnDevice(d) if k <= d.len => {
                let t = self.drafted.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
                if (d.buffer, d.generation) != (super::handoff_id(&self.drafted), t.generation) {
                    return Err(Error::Request("device draft tokens are stale or from another target".into()));
                }
                let mut host = vec![0u32; k];
                self.gpu.stream.memcpy_dtoh(&t.data.slice(..k), &mut host).map_err(drv)?;
                input.extend_from_slice(&host);
            }
            _ => return Err(Error::Request(format!("verify of {k} drafts, the proposal has fewer"))),
        }
        let f = self.forward(&input, LogitRows::All)?;
        Ok(SampledVerify { outcome: VerifyOutcome::Logits(f.logits), captured: Captured::Host(f.captured) })
    }

    /// [`TargetModel::prefill_sampled`] on the device: the prompt as `forward_greedy` runs it
    /// (GEMM chunks or decode steps, captures handed over the same way), with the last row's
    /// argmax replaced by the sampler.
    pub(super) fn prefill_sampled_device(
        &mut self,
        tokens: &[u32],
        filters: &Filters,
        uniform: f64,
    ) -> Result<(u32, Captured)> {
        let v = self.cfg.vocab_size;
        let words = sample_cfg(filters, 0, &[uniform]);
        let shape = SampleShape::of(filters, v);
        // The GEMM path reads the words from step_in; a decode step uploads them with its ids.
        // The result words are poisoned so a path that skipped the sampler cannot pass.
        self.gpu
            .stream
            .memcpy_htod(&words, &mut self.step_in.slice_mut(2 + CHUNK..2 + CHUNK + CFG_WORDS))
            .map_err(drv)?;
        self.gpu.stream.memcpy_htod(&[u32::MAX; 4], &mut self.sample.out).map_err(drv)?;
        self.prefill_sample = Some((words, shape));
        let g = self.forward_greedy(tokens, LogitRows::Last);
        self.prefill_sample = None;
        let g = g?;
        let out = self.gpu.sample_result(&self.sample).map_err(crate::cuda::layers::gpu_err)?;
        if out[2] == 1 {
            // top-p outgrew the candidates: the row (still in the logits buffer) to the host.
            let mut row = vec![0f32; v];
            self.gpu.stream.memcpy_dtoh(&self.logits.slice(..v), &mut row).map_err(drv)?;
            return Ok((draw(&transform(filters, &row), uniform), g.captured));
        }
        if out[1] as usize >= v {
            return Err(Error::Request(format!("the device sampler answered {out:?} for the prompt's last row")));
        }
        Ok((out[1], g.captured))
    }
}
