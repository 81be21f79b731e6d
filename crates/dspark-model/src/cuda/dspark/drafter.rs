//! [`CudaDraft`] behind the [`Drafter`] trait the speculative loop drives: the context it is fed
//! (host rows, or the target's captures in device memory), proposals greedy or drawn along the
//! Markov chain on the host or on the device, deferred proposals whose tokens stay on the GPU
//! for the target's verify, and the logits a sampled verify judges the drafts against.

use super::*;

impl Drafter for CudaDraft {
    fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    fn target_layer_ids(&self) -> &[usize] {
        &self.cfg.target_layer_ids
    }

    fn shared_with_target(&self) -> usize {
        self.shared_bytes
    }

    fn context_len(&self) -> usize {
        self.ctx_len
    }

    fn reset(&mut self) {
        self.ctx_len = 0;
    }

    fn append_context(&mut self, features: &[f32]) -> Result<()> {
        let row = self.cfg.num_taps() * self.cfg.layer.hidden_size;
        let rows = self.cfg.feature_rows(features.len())?;
        self.check_room(rows)?;
        if rows > CHUNK && self.prefill.is_some() {
            return self.append_context_gemm(features);
        }
        for chunk in features.chunks(CHUNK * row) {
            let m = chunk.len() / row;
            let mut buf = self.features.take().ok_or_else(|| Error::Request("draft feature buffer in use".into()))?;
            let r = self.gpu.stream.memcpy_htod(chunk, &mut buf.slice_mut(..chunk.len())).map_err(drv);
            let r = r.and_then(|()| self.append_chunk(&buf.slice(..), m));
            self.features = Some(buf);
            r?;
        }
        Ok(())
    }

    fn append_captured(&mut self, captured: &Captured) -> Result<()> {
        let d = match captured {
            Captured::Host(v) => return self.append_context(v),
            Captured::Device(d) => d,
        };
        if let Some(pc) = self.prefill_capture.clone() {
            if d.buffer == handoff_id(&pc) {
                return self.append_prefill_captures(&pc, d);
            }
        }
        let shared = self.capture.clone();
        let cap = shared.lock().map_err(|_| Error::Request("capture buffer poisoned".into()))?;
        if d.buffer != handoff_id(&shared) || d.generation != cap.generation || d.first + d.rows > CHUNK {
            return Err(Error::Request(
                "device captures are stale or from another target: append them before the next forward".into(),
            ));
        }
        self.check_room(d.rows)?;
        let row = self.cfg.num_taps() * self.cfg.layer.hidden_size;
        let rows = cap.data.slice(d.first * row..(d.first + d.rows) * row);
        self.append_chunk(&rows, d.rows)
    }

    fn propose(&mut self, anchor: u32) -> Result<Proposal> {
        let deferred = self.propose_deferred(anchor)?;
        self.finish_proposal(deferred)
    }

    fn propose_deferred(&mut self, anchor: u32) -> Result<Deferred> {
        self.write_step(anchor, &[])?;
        Ok(Deferred::OnDevice(self.run_propose(Pick::Argmax)?))
    }

    fn can_sample_block(&self) -> bool {
        true
    }

    /// No, for now: the sampled chain runs the device sampler once per slot (one fused launch at
    /// Qwen's recommended filters, three at plain temperature), and `dspark bench`'s
    /// `round_sampled_law` costs 1.04–1.07× a greedy round on an H200 (2026-12-04,
    /// docs/perf.md) against 1.02–1.10× for the greedy law's sampled verify — no clear margin
    /// over the sampled law's measured acceptance gain at top-k 20 / top-p 0.8 (none) or T 0.7
    /// (4%), and its plain-temperature round is not measured yet.
    fn prefers_sampled_block(&self) -> bool {
        false
    }

    /// The host reference of [`Drafter::propose_sampled_device`]: the same launches, eagerly,
    /// with each slot's final logits row copied to the host for `sample_row` and the drawn
    /// token copied back before the next slot's W1 gather.
    fn propose_sampled(&mut self, anchor: u32, sample_row: &mut SampleRow<'_>) -> Result<SampledProposal> {
        let (b, v) = (self.cfg.block_size, self.cfg.layer.vocab_size);
        self.write_step(anchor, &[])?;
        let p = self.ctx_len;
        self.launch_block(p, p + b)?;
        let shared = self.tokens.clone();
        let mut chosen = shared.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
        let rows = self.rows.clone();
        let mut rows = rows.lock().map_err(|_| Error::Request("draft rows poisoned".into()))?;
        let rows = rows.as_mut().ok_or_else(|| Error::Request("draft rows missing".into()))?;
        let (mut tokens, mut q) = (Vec::with_capacity(b), Vec::with_capacity(b));
        let mut row = vec![0f32; v];
        for s in 0..b {
            self.slot_logits(s, &mut rows.logits)?;
            self.gpu.stream.memcpy_dtoh(&rows.logits.slice(s * v..(s + 1) * v), &mut row).map_err(drv)?;
            let (t, q_s) = sample_row(&row);
            if t as usize >= v {
                return Err(Error::Request(format!("the sampler drew token {t} outside the vocabulary ({v})")));
            }
            self.gpu.stream.memcpy_htod(&[t], &mut chosen.data.slice_mut(s..s + 1)).map_err(drv)?;
            self.gather_next(s, &chosen.data)?;
            tokens.push(t);
            q.push(q_s);
        }
        self.launch_confidence()?;
        chosen.generation += 1;
        drop(chosen);
        Ok(SampledProposal { tokens, q, survival: self.survival()?, base_logits: None })
    }

    fn propose_sampled_device(
        &mut self,
        anchor: u32,
        filters: &Filters,
        uniforms: &[f64],
    ) -> Result<Option<DeviceSampled>> {
        let (b, v) = (self.cfg.block_size, self.cfg.layer.vocab_size);
        if !self.device_sampling {
            return Ok(None);
        }
        if uniforms.len() != b {
            return Err(Error::Request(format!(
                "a sampled block of {b} slots takes {b} uniforms, got {}",
                uniforms.len()
            )));
        }
        let cfg: Vec<u32> = uniforms.iter().flat_map(|&u| sample_cfg(filters, 0, &[u])).collect();
        self.write_step(anchor, &cfg)?;
        let tokens = self.run_propose(Pick::Sample(SampleShape::of(filters, v)))?;
        // One read of every slot's out words: a slot whose top-p outgrew the sampler's
        // candidates sends the whole block to the host path (the same block, drawn there).
        let mut out = vec![0u32; 4 * b];
        self.gpu.stream.memcpy_dtoh(&self.slot_out.slice(..4 * b), &mut out).map_err(drv)?;
        if out.chunks(4).any(|o| o[2] != 0) {
            return Ok(None);
        }
        if let Some(bad) = out.chunks(4).find(|o| o[1] as usize >= v) {
            return Err(Error::Request(format!("the device sampler answered {bad:?} for a draft slot")));
        }
        self.device_blocks += 1;
        Ok(Some(DeviceSampled { tokens, survival: self.survival()? }))
    }

    fn sampled_logits(&mut self, tokens: &DeviceTokens) -> Result<Vec<f32>> {
        let (b, v) = (self.cfg.block_size, self.cfg.layer.vocab_size);
        let t = self.tokens.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
        if !tokens.sampled || tokens.buffer != handoff_id(&self.tokens) || tokens.generation != t.generation {
            return Err(Error::Request("device draft rows are stale, greedy, or from another draft".into()));
        }
        let rows = self.rows.lock().map_err(|_| Error::Request("draft rows poisoned".into()))?;
        let rows = rows.as_ref().ok_or_else(|| Error::Request("draft rows missing".into()))?;
        let mut host = vec![0f32; b * v];
        self.gpu.stream.memcpy_dtoh(&rows.logits.slice(..b * v), &mut host).map_err(drv)?;
        Ok(host)
    }

    fn finish_proposal(&mut self, deferred: Deferred) -> Result<Proposal> {
        let d = match deferred {
            Deferred::Ready(p) => return Ok(p),
            Deferred::OnDevice(d) => d,
        };
        let (b, gpu) = (self.cfg.block_size, self.gpu.clone());
        let mut tokens = vec![0u32; b];
        {
            let t = self.tokens.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
            if d.buffer != handoff_id(&self.tokens) || d.generation != t.generation || d.len != b {
                return Err(Error::Request("device draft tokens are stale or from another draft".into()));
            }
            gpu.stream.memcpy_dtoh(&t.data.slice(..b), &mut tokens).map_err(drv)?;
        }
        Ok(Proposal { tokens, survival: self.survival()? })
    }
}
