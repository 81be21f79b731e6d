//! One draft pass for many sequences (issue #30): [`CudaDrafts`], the GPU draft's
//! [`BatchDrafter`].
//!
//! A batched round asks the draft for every running request's block. One at a time
//! (`Sequences<CudaDraft>`), each block streams fc-free but still the five layers and lm_head —
//! most of a ~1.3 ms draft pass — once per request. Here the blocks of up to ⌊64 / B⌋ requests
//! go through one pass:
//!
//! ```text
//! x = embed([a_r, mask × (B−1)] for every r)          (R·B rows)
//! per layer: every projection once over all rows; RoPE/append/attention per request over its
//!            own context caches (`layers::Segment`, not causal), in one segmented launch per
//!            kernel for all requests (`dspark_kernels::cuda::attention_seg`)
//! hidden = RMSNorm(x); logits = lm_head · hidden     (R·B rows)
//! vanilla Markov head (or none): the chains of all requests slot by slot, W2 over R rows a
//!   slot, then every row's confidence in one launch (`chain_all`)
//! gated / RNN head: per request, on the single-sequence buffers: its rows copied in, the chain
//!   slot by slot and the confidence head, exactly as `propose` runs them
//! ```
//!
//! Every row's sums are its single-sequence pass's (the small-M kernels' rows do not depend on
//! the batch; each request's attention runs the same kernels over the same rows; the argmax
//! order is total), so each proposal equals `propose(anchor)` on its sequence alone, bit for
//! bit — tokens and survival. The pass launches eagerly (no graphs). `DSPARK_NO_BATCHED_CHAIN=1`
//! runs every chain request by request, for A/B runs.

use super::{CudaDraft, DraftSeq, Markov, Variant};
use crate::backend::{Captured, Drafter, Proposal};
use crate::batch::{close_slot, open_slot, slot_mut, slots_mut, BatchDrafter, SeqId, SeqState};
use crate::cpu::markov::prefix_survival;
use crate::cuda::layers::{drv, gpu_err, run_layers, Segment};
use crate::cuda::layers_gemm::head_product;
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::ops::StepLens;

/// Rows of one pass (the draft's activation buffers hold this many).
const PASS_ROWS: usize = crate::cuda::qwen3::CHUNK;

/// The buffers of a pass over several sequences' blocks.
pub(super) struct BlockBatch {
    /// Requests one pass takes: ⌊PASS_ROWS / B⌋.
    per_pass: usize,
    /// `[first_pos, kv_len]` per request, then every block's ids.
    step_in: CudaSlice<u32>,
    /// `[per_pass · B, H]` normalised rows and `[per_pass · B, V]` logits.
    hidden: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    /// The chains of all requests at once (`chain_all`): the normalised rows slot-major
    /// (`[B, per_pass, H]`), every slot's e rows slot-major and request-major (`[B, per_pass, r]`
    /// twice), its tokens slot-major (`[B, per_pass]`) and the confidence logits request-major.
    hidden_sm: CudaSlice<f32>,
    e_sm: CudaSlice<f32>,
    e_rm: CudaSlice<f32>,
    tokens_sm: CudaSlice<u32>,
    conf: CudaSlice<f32>,
}

impl CudaDraft {
    /// Plans the buffers of batched block passes (with [`CudaDraft::reserve_sequences`]).
    pub(super) fn plan_block_batch(&mut self) -> Result<()> {
        if self.block_batch.is_some() {
            return Ok(());
        }
        let (b, h, v) = (self.cfg.block_size, self.cfg.layer.hidden_size, self.cfg.layer.vocab_size);
        let per_pass = (PASS_ROWS / b).max(1);
        let rows = per_pass * b;
        // A pass's blocks attend in one launch per kernel (layers::step_segments).
        let layers = self.cfg.layer.num_hidden_layers;
        self.scratch.reserve_segments(&self.arena, &self.gpu, &self.cfg.layer, layers, per_pass)?;
        let r = self.markov.as_ref().map_or(1, |m| m.rank);
        let z = |n: usize| self.arena.zeros::<f32>(n).map_err(drv);
        self.block_batch = Some(BlockBatch {
            per_pass,
            // + every request's anchor, contiguous (the chains' first W1 rows).
            step_in: self.arena.zeros::<u32>(3 * per_pass + rows).map_err(drv)?,
            hidden: z(rows * h)?,
            logits: z(rows * v)?,
            hidden_sm: z(rows * h)?,
            e_sm: z(rows * r)?,
            e_rm: z(rows * r)?,
            tokens_sm: self.arena.zeros::<u32>(rows).map_err(drv)?,
            conf: z(rows)?,
        });
        Ok(())
    }

    /// Greedy proposals after each `(sequence, anchor)`, in passes of up to ⌊64 / B⌋ blocks (see
    /// the module docs); each equals `propose(anchor)` on that sequence alone.
    pub fn propose_many(&mut self, seqs: &mut [(&mut DraftSeq, u32)]) -> Result<Vec<Proposal>> {
        let mut bb = self.block_batch.take().ok_or_else(|| {
            Error::Request("batched draft passes were not planned (CudaDraft::reserve_sequences)".into())
        })?;
        let mut out = Vec::with_capacity(seqs.len());
        let per = bb.per_pass;
        let ran = seqs.chunks_mut(per).try_for_each(|group| {
            out.extend(self.propose_group(&mut bb, group)?);
            Ok::<_, Error>(())
        });
        self.block_batch = Some(bb);
        ran.map(|()| out)
    }

    fn propose_group(&mut self, bb: &mut BlockBatch, group: &mut [(&mut DraftSeq, u32)]) -> Result<Vec<Proposal>> {
        let l = self.cfg.layer.clone();
        let (b, h, v, eps) = (self.cfg.block_size, l.hidden_size, l.vocab_size, l.rms_norm_eps as f32);
        let gpu = self.gpu.clone();
        let (count, n) = (group.len(), group.len() * b);
        // Positions of every block, then its ids, in one copy (which also orders the pass after
        // every earlier kernel, as a single proposal's `write_step` does).
        let mut up = Vec::with_capacity(2 * count + n);
        for (seq, anchor) in group.iter() {
            if *anchor as usize >= v {
                return Err(Error::Request(format!("anchor token {anchor} is outside the vocabulary ({v})")));
            }
            if seq.ctx_len > self.max_len {
                return Err(Error::Request(format!(
                    "draft context of {} positions exceeds {}",
                    seq.ctx_len, self.max_len
                )));
            }
            up.extend_from_slice(&[seq.ctx_len as u32, (seq.ctx_len + b) as u32]);
        }
        for (_, anchor) in group.iter() {
            up.push(*anchor);
            up.extend(std::iter::repeat_n(self.cfg.mask_token_id, b - 1));
        }
        let anchors_at = up.len();
        up.extend(group.iter().map(|(_, anchor)| *anchor));
        gpu.stream.memcpy_htod(&up, &mut bb.step_in.slice_mut(..up.len())).map_err(drv)?;
        let ids_at = 2 * count;
        gpu.embedding(&*self.embed_tokens, h, &bb.step_in.slice(ids_at..ids_at + n), n, &mut self.x.slice_mut(..n * h))
            .map_err(gpu_err)?;
        {
            let mut segments: Vec<Segment<'_>> = Vec::with_capacity(count);
            for (k, (seq, _)) in group.iter_mut().enumerate() {
                let p = seq.ctx_len;
                let lens = StepLens { dev: bb.step_in.slice(2 * k..2 * k + 2), first_pos: p, kv_cap: p + b };
                segments.push(Segment { start: k * b, rows: b, lens, caches: seq.caches.caches_mut() });
            }
            run_layers(
                &gpu,
                &l,
                &self.layers,
                &mut self.scratch,
                &mut self.x.slice_mut(..n * h),
                (n, false),
                &self.inv_freq,
                &mut segments,
                None,
                |_, _| Ok(()),
            )?;
        }
        gpu.rmsnorm(&self.x.slice(..n * h), &self.norm.as_view(), eps, n, &mut bb.hidden.slice_mut(..n * h))
            .map_err(gpu_err)?;
        if self.chains_together() {
            return self.chain_all(bb, count, anchors_at);
        }
        self.head_rows(bb, false, n)?;

        // Each request's chain on the single-sequence buffers, as `launch_propose` runs it.
        let mut out = Vec::with_capacity(count);
        for k in 0..count {
            gpu.stream
                .memcpy_dtod(&bb.hidden.slice(k * b * h..(k + 1) * b * h), &mut self.hidden.slice_mut(..b * h))
                .map_err(drv)?;
            let rows = self.rows.clone();
            let mut rows = rows.lock().map_err(|_| Error::Request("draft rows poisoned".into()))?;
            let rows = rows.as_mut().ok_or_else(|| Error::Request("draft rows missing".into()))?;
            gpu.stream
                .memcpy_dtod(&bb.logits.slice(k * b * v..(k + 1) * b * v), &mut rows.logits.slice_mut(..b * v))
                .map_err(drv)?;
            // The chain's start: the RNN state zeroed and e₀ = W1[anchor].
            if let Some(Markov { variant: Variant::Rnn { state, .. }, .. }) = &mut self.markov {
                gpu.stream.memset_zeros(state).map_err(drv)?;
            }
            if let Some(m) = &self.markov {
                let r = m.rank;
                let anchor = bb.step_in.slice(ids_at + k * b..ids_at + k * b + 1);
                gpu.gather_row(&m.w1, r, &anchor, &mut self.e.slice_mut(..r)).map_err(gpu_err)?;
            }
            let shared = self.tokens.clone();
            let mut chosen = shared.lock().map_err(|_| Error::Request("draft token buffer poisoned".into()))?;
            for s in 0..b {
                self.slot_argmax(s, &mut chosen.data, &mut rows.logits)?;
            }
            self.launch_confidence()?;
            let mut tokens = vec![0u32; b];
            gpu.stream.memcpy_dtoh(&chosen.data.slice(..b), &mut tokens).map_err(drv)?;
            chosen.generation += 1;
            drop(chosen);
            out.push(Proposal { tokens, survival: self.survival()? });
        }
        Ok(out)
    }
}

impl CudaDraft {
    /// `logits = lm_head · hidden` for the `n` normalised rows in `bb.hidden` (request-major)
    /// or `bb.hidden_sm` (slot-major), on the row GEMM where the mode planned lm_head
    /// (`layers_gemm::head_product`).
    fn head_rows(&mut self, bb: &mut BlockBatch, slot_major: bool, n: usize) -> Result<()> {
        let (h, v) = (self.cfg.layer.hidden_size, self.cfg.layer.vocab_size);
        let hidden = if slot_major { bb.hidden_sm.slice(..n * h) } else { bb.hidden.slice(..n * h) };
        let mut logits = bb.logits.slice_mut(..n * v);
        head_product(&self.gpu, &self.lm_head, &hidden, &mut self.scratch.half, &mut logits, (n, h, v))
    }

    /// Whether the requests' chains can run together, slot by slot (`chain_all`): a vanilla
    /// Markov head (e_s alone is W2's input) or none. The gated and RNN heads' per-slot inputs
    /// keep the request-by-request chain.
    fn chains_together(&self) -> bool {
        std::env::var_os("DSPARK_NO_BATCHED_CHAIN").is_none()
            && self.markov.as_ref().is_none_or(|m| matches!(m.variant, Variant::Vanilla))
    }

    /// lm_head and the Markov chains of `count` requests whose normalised rows are in
    /// `bb.hidden` (request-major), slot by slot for all requests at once:
    ///
    /// ```text
    /// logits[s, ·] = lm_head · hidden[·, s]                 (rows slot-major: one launch)
    /// e[0, ·] = W1[anchor of each request]
    /// per slot s: logits[s, ·] += W2 · e[s, ·]; token[s, ·] = argmax; e[s+1, ·] = W1[token]
    /// confidence of every (request, slot) row                 (one launch)
    /// ```
    ///
    /// Every row's sums are the single chain's (the products' rows do not depend on the batch,
    /// the argmax order is total, W1 rows are widened exactly), so each proposal equals
    /// `propose(anchor)` alone: tokens and survival.
    fn chain_all(&mut self, bb: &mut BlockBatch, count: usize, anchors_at: usize) -> Result<Vec<Proposal>> {
        let l = &self.cfg.layer;
        let (b, h, v) = (self.cfg.block_size, l.hidden_size, l.vocab_size);
        let gpu = self.gpu.clone();
        let n = count * b;
        // Rows slot-major: row s·count + k is request k's slot s.
        for s in 0..b {
            let src = bb.hidden.slice(s * h..n * h);
            let mut dst = bb.hidden_sm.slice_mut(s * count * h..(s + 1) * count * h);
            gpu.copy_rows(&src, &mut dst, count, h, (b * h, h)).map_err(gpu_err)?;
        }
        self.head_rows(bb, true, n)?;
        let r = self.markov.as_ref().map_or(0, |m| m.rank);
        if let Some(m) = &self.markov {
            let anchors = bb.step_in.slice(anchors_at..anchors_at + count);
            gpu.embedding(&m.w1, r, &anchors, count, &mut bb.e_sm.slice_mut(..count * r)).map_err(gpu_err)?;
        }
        for s in 0..b {
            let rows = s * count..(s + 1) * count;
            let mut logits_s = bb.logits.slice_mut(rows.start * v..rows.end * v);
            if let Some(m) = &self.markov {
                let e_s = bb.e_sm.slice(rows.start * r..rows.end * r);
                gpu.matvec(&m.w2, &e_s, &mut logits_s, (count, r, v), true).map_err(gpu_err)?;
            }
            let mut tokens_s = bb.tokens_sm.slice_mut(rows.clone());
            gpu.argmax_split(&logits_s.as_view(), v, v, count, &mut tokens_s, &mut self.scratch.ops)
                .map_err(gpu_err)?;
            if let (Some(m), true) = (&self.markov, s + 1 < b) {
                let next = bb.e_sm.slice_mut(rows.end * r..(rows.end + count) * r);
                gpu.embedding(&m.w1, r, &bb.tokens_sm.slice(rows), count, &mut { next }).map_err(gpu_err)?;
            }
        }
        let mut survival = vec![None; count];
        if let Some(c) = &self.confidence {
            // e request-major beside the hidden rows: row k·b + s.
            let re = r.max(1);
            if r > 0 {
                for s in 0..b {
                    let src = bb.e_sm.slice(s * count * r..(s + 1) * count * r);
                    let mut dst = bb.e_rm.slice_mut(s * r..n * r);
                    gpu.copy_rows(&src, &mut dst, count, r, (r, b * r)).map_err(gpu_err)?;
                }
            }
            gpu.confidence(
                &c.weight.as_view(),
                c.bias,
                &bb.hidden.slice(..n * h),
                &bb.e_rm.slice(..(n * r).max(re)),
                (n, h, r),
                c.with_markov && r > 0,
                &mut bb.conf.slice_mut(..n),
            )
            .map_err(gpu_err)?;
            let mut conf = vec![0f32; n];
            gpu.stream.memcpy_dtoh(&bb.conf.slice(..n), &mut conf).map_err(drv)?;
            for (k, sv) in survival.iter_mut().enumerate() {
                *sv = Some(prefix_survival(&conf[k * b..(k + 1) * b]));
            }
        }
        let mut tokens = vec![0u32; n];
        gpu.stream.memcpy_dtoh(&bb.tokens_sm.slice(..n), &mut tokens).map_err(drv)?;
        Ok((0..count)
            .zip(survival)
            .map(|(k, survival)| Proposal { tokens: (0..b).map(|s| tokens[s * count + k]).collect(), survival })
            .collect())
    }
}

/// Several sequences' draft contexts and one batched block pass for all of them (see the module
/// docs); everything else runs on one sequence at a time, swapped into the draft.
pub struct CudaDrafts {
    draft: CudaDraft,
    /// Index = [`SeqId`]; `None` for a free id.
    seqs: Vec<Option<DraftSeq>>,
}

impl CudaDrafts {
    /// Takes a draft whose sequences are reserved ([`CudaDraft::reserve_sequences`]).
    pub fn new(draft: CudaDraft) -> CudaDrafts {
        CudaDrafts { draft, seqs: Vec::new() }
    }

    /// The draft (with no sequence's context in it).
    pub fn draft(&mut self) -> &mut CudaDraft {
        &mut self.draft
    }

    /// Runs `f` on the draft with sequence `id`'s context swapped in (the bench holds a
    /// context's length fixed through it).
    pub fn with<R>(&mut self, id: SeqId, f: impl FnOnce(&mut CudaDraft) -> Result<R>) -> Result<R> {
        let seq = slot_mut(&mut self.seqs, id)?;
        self.draft.swap_state(seq);
        let out = f(&mut self.draft);
        self.draft.swap_state(seq);
        out
    }
}

impl BatchDrafter for CudaDrafts {
    fn block_size(&self) -> usize {
        self.draft.block_size()
    }

    fn target_layer_ids(&self) -> &[usize] {
        self.draft.target_layer_ids()
    }

    fn open(&mut self) -> Result<SeqId> {
        let seq = self.draft.new_state()?;
        Ok(open_slot(&mut self.seqs, seq))
    }

    fn close(&mut self, id: SeqId) -> Result<()> {
        let seq = close_slot(&mut self.seqs, id)?;
        self.draft.release_state(seq);
        Ok(())
    }

    fn append_captured(&mut self, id: SeqId, captured: &Captured) -> Result<()> {
        self.with(id, |d| d.append_captured(captured))
    }

    fn propose_batch(&mut self, items: &[(SeqId, u32)]) -> Result<Vec<Proposal>> {
        let ids: Vec<SeqId> = items.iter().map(|it| it.0).collect();
        let taken = slots_mut(&mut self.seqs, &ids, "pass")?;
        let mut seqs: Vec<(&mut DraftSeq, u32)> = taken.into_iter().zip(items).map(|(s, it)| (s, it.1)).collect();
        self.draft.propose_many(&mut seqs)
    }

    fn with_draft(&mut self, id: SeqId, f: &mut dyn FnMut(&mut dyn Drafter) -> Result<()>) -> Result<()> {
        self.with(id, |d| f(d))
    }
}
