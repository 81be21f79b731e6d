//! The draft's two heads after its layers, on the device: the low-rank Markov chain, run slot
//! by slot (DSPARK.md §3.1–3.2: logits_s = lm_head(h_s) + W2·u_s with e = W1[token_{s−1}], u = e
//! for the vanilla head, g ⊙ e for the gated one, tanh(o) of the RNN's state update), and the
//! confidence head over every slot's h_s and e_s (§3.3). The previous slot's token never leaves
//! the device: the greedy chain fuses its argmax and the next W1 row into the W2 product, and
//! the sampled chain draws each slot first (`CudaDraft::launch_propose`).

use super::CudaDraft;
use crate::cuda::layers::gpu_err;
use crate::error::Result;
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::host_table::Table;
use dspark_kernels::cuda::ops::WeightBuf;

pub(super) enum Variant {
    Vanilla,
    Gated { weight: CudaSlice<f32>, bias: CudaSlice<f32> },
    Rnn { weight: CudaSlice<f32>, bias: CudaSlice<f32>, state: CudaSlice<f32>, scratch: CudaSlice<f32> },
}

pub(super) struct Markov {
    pub(super) rank: usize,
    /// W1 `[vocab, rank]`: gathered a row a slot, never streamed, so it follows the target's
    /// embedding to mapped host memory under `--embeddings host` (`build.rs`).
    pub(super) w1: Table,
    pub(super) w2: WeightBuf,
    pub(super) variant: Variant,
}

pub(super) struct Confidence {
    pub(super) weight: CudaSlice<f32>,
    pub(super) bias: f32,
    pub(super) with_markov: bool,
}

impl CudaDraft {
    /// Slot `s`'s Markov input: e_s itself (vanilla), or u from the gated / RNN prep kernel,
    /// which it runs. Returns whether the input is in `self.u`; `None` without a Markov head.
    fn slot_prep(&mut self, s: usize) -> Result<Option<bool>> {
        let h = self.cfg.layer.hidden_size;
        let gpu = self.gpu.clone();
        let Some(m) = &mut self.markov else { return Ok(None) };
        let r = m.rank;
        let h_s = self.hidden.slice(s * h..(s + 1) * h);
        let e_s = self.e.slice(s * r..(s + 1) * r);
        match &mut m.variant {
            Variant::Vanilla => return Ok(Some(false)),
            Variant::Gated { weight, bias } => gpu
                .markov_gated_prep(&weight.as_view(), &bias.as_view(), &h_s, &e_s, &mut self.u.slice_mut(..r))
                .map_err(gpu_err)?,
            Variant::Rnn { weight, bias, state, scratch } => gpu
                .markov_rnn_prep(
                    &weight.as_view(),
                    &bias.as_view(),
                    &h_s,
                    &e_s,
                    &mut state.as_view_mut(),
                    &mut scratch.as_view_mut(),
                    &mut self.u.slice_mut(..r),
                )
                .map_err(gpu_err)?,
        }
        Ok(Some(true))
    }

    /// The greedy chain's slot `s`: logits_s += W2·u, its argmax into `tokens[s]` and the next
    /// W1 row — one launch on the tensor cores for bf16 W2 and W1.
    pub(super) fn slot_argmax(
        &mut self,
        s: usize,
        tokens: &mut CudaSlice<u32>,
        logits: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (b, v) = (self.cfg.block_size, self.cfg.layer.vocab_size);
        let gpu = self.gpu.clone();
        let uses_u = self.slot_prep(s)?;
        let mut logits_s = logits.slice_mut(s * v..(s + 1) * v);
        let mut token_s = tokens.slice_mut(s..s + 1);
        let Some(m) = &self.markov else {
            return gpu
                .argmax_split(&logits_s.as_view(), v, v, 1, &mut token_s, &mut self.scratch.ops)
                .map_err(gpu_err);
        };
        let r = m.rank;
        let mut pair = self.e.slice_mut(s * r..(s + 2).min(b) * r);
        let (e_s, mut e_next) = pair.split_at_mut(r);
        let input = if uses_u == Some(true) { self.u.slice(..r) } else { e_s.as_view() };
        let gather = if s + 1 < b { Some((((&m.w1).into(), r), &mut e_next)) } else { None };
        gpu.matvec_argmax(&m.w2, &input, &mut logits_s, (r, v), true, &mut token_s, &mut self.scratch.ops, gather)
            .map_err(gpu_err)
    }

    /// The sampled chain's slot `s` up to its final logits: logits_s += W2·u, through the plain
    /// accumulating matvec (the device and host sampled paths share it, so they see the same
    /// bits).
    pub(super) fn slot_logits(&mut self, s: usize, logits: &mut CudaSlice<f32>) -> Result<()> {
        let v = self.cfg.layer.vocab_size;
        let uses_u = self.slot_prep(s)?;
        let Some(m) = &self.markov else { return Ok(()) };
        let r = m.rank;
        let input = if uses_u == Some(true) { self.u.slice(..r) } else { self.e.slice(s * r..(s + 1) * r) };
        self.gpu.matvec(&m.w2, &input, &mut logits.slice_mut(s * v..(s + 1) * v), (1, r, v), true).map_err(gpu_err)
    }

    /// e_{s+1} = W1[tokens[s]] for the next slot (nothing after the last, or without a head).
    pub(super) fn gather_next(&mut self, s: usize, tokens: &CudaSlice<u32>) -> Result<()> {
        let b = self.cfg.block_size;
        match &self.markov {
            Some(m) if s + 1 < b => {
                let r = m.rank;
                let mut e_next = self.e.slice_mut((s + 1) * r..(s + 2) * r);
                self.gpu.gather_row(&m.w1, r, &tokens.slice(s..s + 1), &mut e_next).map_err(gpu_err)
            }
            _ => Ok(()),
        }
    }

    /// The confidence logits of every slot, from h_s and the chain's e_s.
    pub(super) fn launch_confidence(&mut self) -> Result<()> {
        let (b, h) = (self.cfg.block_size, self.cfg.layer.hidden_size);
        let r = self.markov.as_ref().map_or(0, |m| m.rank);
        if let Some(c) = &self.confidence {
            self.gpu
                .confidence(
                    &c.weight.as_view(),
                    c.bias,
                    &self.hidden.slice(..b * h),
                    &self.e.slice(..(b * r).max(1)),
                    (b, h, r),
                    c.with_markov && r > 0,
                    &mut self.conf_logits.slice_mut(..b),
                )
                .map_err(gpu_err)?;
        }
        Ok(())
    }
}
