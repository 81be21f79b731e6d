//! The target-model interface the decoding loops drive.
//!
//! A target holds a KV cache of `len()` committed positions. [`TargetModel::forward`] runs new
//! tokens at positions `len() .. len() + n` in one pass — prefill (n = prompt length), decode
//! (n = 1) and speculative verify (n = k + 1) are the same call — appends them to the cache,
//! and returns logits plus the captured layer outputs the DSpark draft consumes.
//! [`TargetModel::truncate`] rolls the cache back after a partly rejected verify.
//!
//! The loops in `dspark-spec` see only this trait, so the CPU reference and the CUDA backend
//! are interchangeable under them (Architecture Invariant: spec never names a backend).

use crate::checkpoint::config::Qwen3Config;
use crate::error::{Error, Result};
pub use dspark_kernels::cpu::sample::Filters;

/// Which rows of a forward pass need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// Every processed position (verify).
    All,
    /// Only the last processed position (prefill, plain decode).
    Last,
}

/// Output of one forward pass.
#[derive(Clone, Debug, Default)]
pub struct Forward {
    /// `[rows, vocab]` row-major logits, in f32.
    pub logits: Vec<f32>,
    /// Number of logit rows (all processed tokens, or 1 for [`LogitRows::Last`]).
    pub rows: usize,
    /// `[tokens, T · hidden]`: for every processed token, the outputs of the captured layers in
    /// the order given to [`TargetModel::set_capture`]. Empty when nothing is captured.
    pub captured: Vec<f32>,
}

impl Forward {
    /// Logits of row `r`.
    pub fn row(&self, r: usize, vocab: usize) -> &[f32] {
        &self.logits[r * vocab..(r + 1) * vocab]
    }
}

/// Captured layer outputs of a forward, where they live: copied to the host, or left in a
/// device buffer the target shares with a draft on the same GPU (so a speculative round moves
/// no features through the host).
#[derive(Clone, Debug)]
pub enum Captured {
    /// `[rows, T · hidden]` row-major.
    Host(Vec<f32>),
    /// Rows `first .. first + rows` of a device buffer the target shares with its drafts, valid
    /// until its next forward (a batched forward's items have their rows one after another).
    Device(DeviceRows),
}

/// A handle to rows of a device capture buffer (see [`Captured::Device`]).
#[derive(Clone, Debug)]
pub struct DeviceRows {
    /// Which buffer and which forward wrote it; a draft refuses a stale handle.
    pub buffer: usize,
    pub generation: u64,
    /// The first row of these captures in the buffer.
    pub first: usize,
    pub rows: usize,
}

impl Captured {
    /// The first `rows` rows (`row_len` floats each on the host).
    pub fn prefix(&self, rows: usize, row_len: usize) -> Captured {
        match self {
            Captured::Host(v) => Captured::Host(v[..(rows * row_len).min(v.len())].to_vec()),
            Captured::Device(d) => Captured::Device(DeviceRows { rows: rows.min(d.rows), ..d.clone() }),
        }
    }
}

/// Output of a greedy forward: the argmax of each requested logits row, and the captures.
#[derive(Clone, Debug)]
pub struct Greedy {
    pub ids: Vec<u32>,
    pub captured: Captured,
}

/// A Qwen3 target with a KV cache.
pub trait TargetModel {
    fn config(&self) -> &Qwen3Config;
    /// Positions currently in the KV cache.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Most positions the cache can hold.
    fn max_len(&self) -> usize;
    /// Keeps positions `0..len` and drops the rest. `len` beyond the current length is an error.
    fn truncate(&mut self, len: usize) -> Result<()>;
    /// Chooses which decoder layers' outputs (residual stream after the layer, before the final
    /// norm) every later forward returns in [`Forward::captured`].
    fn set_capture(&mut self, layers: &[usize]) -> Result<()>;
    /// Most prompt tokens whose captures one forward hands over without the host: a loop feeds
    /// a longer prompt in chunks of this size and gives each chunk's captures to the draft
    /// before the next forward overwrites them (the CUDA GEMM prefill's buffer). Unbounded by
    /// default.
    fn prefill_chunk(&self) -> usize {
        usize::MAX
    }
    /// Runs `tokens` at positions `len()..len() + tokens.len()` and appends them to the cache.
    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Forward>;
    /// [`TargetModel::forward`] returning only each logits row's argmax (lowest index on ties),
    /// which is all greedy decoding needs. The CUDA target takes the argmax on the device and
    /// keeps short forwards' captures there.
    fn forward_greedy(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Greedy> {
        let f = self.forward(tokens, rows)?;
        let vocab = self.config().vocab_size;
        let ids = (0..f.rows).map(|r| dspark_kernels::cpu::argmax::argmax(f.row(r, vocab)) as u32).collect();
        Ok(Greedy { ids, captured: Captured::Host(f.captured) })
    }

    /// Verifies `[anchor, d_1 .. d_k]` — the first `k` tokens of a proposal, wherever it lives —
    /// as [`TargetModel::forward_greedy`] with every row's argmax. A CUDA target reads a
    /// proposal its draft left on the GPU ([`Deferred::OnDevice`]) without a round trip through
    /// the host; any target verifies a host proposal.
    fn verify_greedy(&mut self, anchor: u32, drafts: &Deferred, k: usize) -> Result<Greedy> {
        verify_on_host(self, anchor, drafts, k)
    }

    /// Verifies `[anchor, d_1 .. d_k]` under sampling: with `uniforms` = the round's k accept
    /// uniforms and then the draw's, accept `d_{i+1}` iff `u_i < p'_i(d_{i+1}) / q_i(d_{i+1})`,
    /// and draw the token after the accepted ones from the first rejecting row's residual or
    /// from row k — the speculative loop's host rule, with `p'` = `filters`' transform
    /// (`dspark_kernels::cpu::sample`). q is one-hot (the greedy draft law; the residual is p'
    /// without its draft) unless the drafts are a device-sampled block
    /// ([`DeviceTokens::sampled`]: q is the row each was drawn from, the residual
    /// max(0, p' − q)). A
    /// target that can decide on the device answers [`VerifyOutcome::Drawn`] (the CUDA target:
    /// no logits leave the GPU); any other, or one that cannot finish a round, returns the rows'
    /// logits and the caller applies the rule. k = 0 is a plain sampled step.
    fn verify_sampled(
        &mut self,
        anchor: u32,
        drafts: &Deferred,
        k: usize,
        filters: &Filters,
        uniforms: &[f64],
    ) -> Result<SampledVerify> {
        let _ = (filters, uniforms);
        let f = match drafts {
            Deferred::Ready(p) if k <= p.tokens.len() => {
                let mut input = vec![anchor];
                input.extend_from_slice(&p.tokens[..k]);
                self.forward(&input, LogitRows::All)?
            }
            _ => return Err(Error::Request(format!("verify of {k} drafts this target cannot read"))),
        };
        Ok(SampledVerify { outcome: VerifyOutcome::Logits(f.logits), captured: Captured::Host(f.captured) })
    }

    /// Runs the prompt (or its last chunk) as [`TargetModel::forward`] does and draws the token
    /// after it from the last row under `filters` with `uniform` — the first token of a sampled
    /// generation — returning it with the captures. The CUDA target draws on the device (the
    /// same bits); this default copies the row to the host and runs `cpu::sample`.
    fn prefill_sampled(&mut self, tokens: &[u32], filters: &Filters, uniform: f64) -> Result<(u32, Captured)> {
        prefill_sampled_on_host(self, tokens, filters, uniform)
    }
}

/// [`TargetModel::prefill_sampled`] through host logits and `cpu::sample` (the default, and the
/// CUDA target's reference path).
pub fn prefill_sampled_on_host<T: TargetModel + ?Sized>(
    target: &mut T,
    tokens: &[u32],
    filters: &Filters,
    uniform: f64,
) -> Result<(u32, Captured)> {
    let f = target.forward(tokens, LogitRows::Last)?;
    let row = f.row(f.rows - 1, target.config().vocab_size);
    let t = dspark_kernels::cpu::sample::draw(&dspark_kernels::cpu::sample::transform(filters, row), uniform);
    Ok((t, Captured::Host(f.captured)))
}

/// What [`TargetModel::verify_sampled`] returns: the decision or the logits, and the captures.
#[derive(Clone, Debug)]
pub struct SampledVerify {
    pub outcome: VerifyOutcome,
    pub captured: Captured,
}

#[derive(Clone, Debug, PartialEq)]
pub enum VerifyOutcome {
    /// Decided on the device: `accepted` drafts, then `next`.
    Drawn { accepted: usize, next: u32 },
    /// `[k + 1, vocab]` logits for the caller's host rule.
    Logits(Vec<f32>),
}

/// [`TargetModel::verify_greedy`] of a host proposal (and the error for a device one).
pub fn verify_on_host<T: TargetModel + ?Sized>(
    target: &mut T,
    anchor: u32,
    drafts: &Deferred,
    k: usize,
) -> Result<Greedy> {
    let Deferred::Ready(p) = drafts else {
        return Err(Error::Request("this target cannot read draft tokens held on a GPU; use a CUDA target".into()));
    };
    if k > p.tokens.len() {
        return Err(Error::Request(format!("verify of {k} drafts, the proposal has {}", p.tokens.len())));
    }
    let mut input = Vec::with_capacity(k + 1);
    input.push(anchor);
    input.extend_from_slice(&p.tokens[..k]);
    target.forward_greedy(&input, LogitRows::All)
}

/// A proposal that may not have reached the host yet (see [`Drafter::propose_deferred`]).
#[derive(Clone, Debug)]
pub enum Deferred {
    /// Tokens (and survival) on the host.
    Ready(Proposal),
    /// The tokens sit in the device buffer a CUDA target shares with its draft; the target's
    /// [`TargetModel::verify_greedy`] reads them there and [`Drafter::finish_proposal`] brings
    /// them to the host afterwards.
    OnDevice(DeviceTokens),
}

/// A handle to the draft tokens of one proposal in a shared device buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTokens {
    /// Which buffer and which proposal wrote it; a stale handle is refused.
    pub buffer: usize,
    pub generation: u64,
    /// Draft tokens in the buffer (B).
    pub len: usize,
    /// Drawn along the Markov chain (the sampled draft law, [`Drafter::propose_sampled_device`]):
    /// the rows each draft was drawn from stay on the device beside the tokens, and a target's
    /// [`TargetModel::verify_sampled`] judges the drafts against them. `false`: one-hot drafts.
    pub sampled: bool,
}

/// A sampled-law block drawn on the device ([`Drafter::propose_sampled_device`]).
#[derive(Clone, Debug)]
pub struct DeviceSampled {
    /// The tokens and their q rows, in the buffers the target's verify reads.
    pub tokens: DeviceTokens,
    /// Prefix survival along the sampled chain, as [`SampledProposal::survival`].
    pub survival: Option<Vec<f32>>,
}

/// What a drafter proposes for one block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposal {
    /// Draft tokens `d_1 .. d_B` for positions `p+1 .. p+B`.
    pub tokens: Vec<u32>,
    /// Prefix survival `a_s` (probability that drafts `1..=s+1` are all accepted) from the
    /// confidence head, when the draft has one.
    pub survival: Option<Vec<f32>>,
}

/// A block drawn along the draft's Markov chain rather than taken greedily (see
/// [`Drafter::propose_sampled`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampledProposal {
    /// Draft tokens `d_1 .. d_B`, `d_s` drawn from `q[s - 1]`.
    pub tokens: Vec<u32>,
    /// `q[s]`: the distribution slot `s` was drawn from — exactly the row the sampler returned
    /// for that slot's logits (the request's transform of `U_s + bias(d_{s-1})`), kept for the
    /// acceptance ratio.
    pub q: Vec<Vec<f64>>,
    /// Prefix survival along the sampled chain (the confidence head fed `W1[d_{s-1}]`), when the
    /// draft has a confidence head; entry `s` depends on `anchor, d_1 .. d_s` only.
    pub survival: Option<Vec<f32>>,
    /// `[B, V]`: the backbone's logits `U_s` before the Markov bias, when the draft reports them
    /// (diagnostics; the loop's fault tests build a wrong `q` from them).
    pub base_logits: Option<Vec<f32>>,
}

/// Draws one slot's token: given the slot's final logits (Markov bias included), returns the
/// token and the distribution it was drawn from. Built by the decoding loop from its sampler,
/// so this crate needs none.
pub type SampleRow<'a> = dyn FnMut(&[f32]) -> (u32, Vec<f64>) + 'a;

/// A block drafter fed by the target's tapped hidden states (DSPARK.md §2, §4).
///
/// The drafter keeps its own context of committed positions `0 .. context_len()`; the loop
/// appends the tapped features of newly committed positions, then asks for a block whose anchor
/// sits at position `context_len()`.
pub trait Drafter {
    /// Draft tokens per block (B).
    fn block_size(&self) -> usize;
    /// Target layers whose outputs the drafter consumes, in feature order.
    fn target_layer_ids(&self) -> &[usize];
    /// Bytes of the drafter's own `embed_tokens` / `lm_head` copies it does not hold because
    /// they equal the target's (`checkpoint::shared_heads`): the memory sharing saved.
    fn shared_with_target(&self) -> usize {
        0
    }
    /// Committed positions in the drafter's context.
    fn context_len(&self) -> usize;
    /// Forgets all context.
    fn reset(&mut self);
    /// Appends `[n, T · hidden]` features for the next `n` committed positions.
    fn append_context(&mut self, features: &[f32]) -> Result<()>;
    /// [`Drafter::append_context`] from a forward's captures, wherever they live. Drafts that
    /// cannot read device captures take host ones only.
    fn append_captured(&mut self, captured: &Captured) -> Result<()> {
        match captured {
            Captured::Host(v) => self.append_context(v),
            Captured::Device(_) => {
                Err(Error::Request("this draft cannot read captures held on a GPU; use a CUDA draft".into()))
            }
        }
    }
    /// Proposes `B` tokens following `anchor`, which sits at position `context_len()`.
    fn propose(&mut self, anchor: u32) -> Result<Proposal>;

    /// [`Drafter::propose`] without waiting for the tokens: a CUDA draft leaves them on the GPU
    /// for its target to verify straight away ([`Deferred::OnDevice`]), so the round's only
    /// host synchronisation is reading the verify's result. Other drafts propose now.
    fn propose_deferred(&mut self, anchor: u32) -> Result<Deferred> {
        Ok(Deferred::Ready(self.propose(anchor)?))
    }

    /// Whether [`Drafter::propose_sampled`] is implemented (a caller picking a draft law asks
    /// this).
    fn can_sample_block(&self) -> bool {
        false
    }

    /// Whether the sampled draft law is the better default here: it accepts more at high
    /// temperatures, but a draft whose sampled block costs clearly more than its argmax chain
    /// can lose that gain in time (the CUDA draft, see its implementation). Callers default to
    /// the greedy law when this is false; an explicit choice still gets either.
    fn prefers_sampled_block(&self) -> bool {
        self.can_sample_block()
    }

    /// Proposes `B` tokens following `anchor` by drawing each slot along the Markov chain:
    /// slot `s`'s logits are computed exactly as the greedy chain computes them before its
    /// argmax, with the previous slot's *drawn* token as the Markov input (`d_0` = the anchor),
    /// and `sample_row` picks the token (called once per slot, in slot order). Drafts that
    /// cannot sample their block refuse.
    fn propose_sampled(&mut self, anchor: u32, sample_row: &mut SampleRow<'_>) -> Result<SampledProposal> {
        let _ = (anchor, sample_row);
        Err(Error::Request("this drafter cannot sample its block; use the greedy draft law".into()))
    }

    /// [`Drafter::propose_sampled`] on the device: slot `s` is drawn from the request's transform
    /// (`filters`) of its logits with `uniforms[s]`, the tokens and each slot's q row staying on
    /// the GPU for the target's verify ([`DeviceTokens::sampled`]). The same tokens and q as
    /// `propose_sampled` with a sampler that draws slot `s` with `uniforms[s]`. `None` when this
    /// draft cannot (no device sampler, or a slot that needs the host: the caller then calls
    /// `propose_sampled` with the same uniforms, which gives the same block).
    fn propose_sampled_device(
        &mut self,
        anchor: u32,
        filters: &Filters,
        uniforms: &[f64],
    ) -> Result<Option<DeviceSampled>> {
        let _ = (anchor, filters, uniforms);
        Ok(None)
    }

    /// The `[B, V]` logits rows a device-sampled block was drawn from (Markov bias included), for
    /// a host rule when the target hands its own rows back.
    fn sampled_logits(&mut self, tokens: &DeviceTokens) -> Result<Vec<f32>> {
        let _ = tokens;
        Err(Error::Request("this draft holds no sampled block on a GPU".into()))
    }

    /// The host copy of a [`Drafter::propose_deferred`] proposal (read after the verify).
    fn finish_proposal(&mut self, deferred: Deferred) -> Result<Proposal> {
        match deferred {
            Deferred::Ready(p) => Ok(p),
            Deferred::OnDevice(_) => Err(Error::Request("this draft holds no proposal on a GPU".into())),
        }
    }
}

/// Checks shared by every [`TargetModel::forward`]: tokens present, inside the vocabulary, and
/// fitting the cache of `max_len` positions after the `len` already there.
pub(crate) fn check_forward(cfg: &Qwen3Config, len: usize, max_len: usize, tokens: &[u32]) -> Result<()> {
    if tokens.is_empty() {
        return Err(Error::Request("forward called with no tokens".into()));
    }
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(Error::Request(format!(
            "token id {bad} is outside the vocabulary (vocab_size = {})",
            cfg.vocab_size
        )));
    }
    if len + tokens.len() > max_len {
        return Err(Error::Request(format!(
            "sequence of {} positions exceeds the context of {max_len} (max_position_embeddings = {})",
            len + tokens.len(),
            cfg.max_position_embeddings
        )));
    }
    Ok(())
}

/// Checks for [`TargetModel::set_capture`] and [`TargetModel::truncate`].
pub(crate) fn check_capture(cfg: &Qwen3Config, layers: &[usize]) -> Result<()> {
    match layers.iter().find(|&&l| l >= cfg.num_hidden_layers) {
        Some(bad) => {
            Err(Error::Request(format!("cannot capture layer {bad}: the model has {} layers", cfg.num_hidden_layers)))
        }
        None => Ok(()),
    }
}

pub(crate) fn check_truncate(len: usize, to: usize) -> Result<()> {
    if to > len {
        return Err(Error::Request(format!("cannot truncate a {len}-position cache to {to}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_prefix_keeps_whole_rows() {
        let host = Captured::Host((0..12).map(|v| v as f32).collect());
        match host.prefix(2, 4) {
            Captured::Host(v) => assert_eq!(v, vec![0., 1., 2., 3., 4., 5., 6., 7.]),
            other => panic!("{other:?}"),
        }
        let dev = Captured::Device(DeviceRows { buffer: 7, generation: 3, first: 0, rows: 8 });
        match dev.prefix(5, 4) {
            Captured::Device(d) => assert_eq!((d.buffer, d.generation, d.rows), (7, 3, 5)),
            other => panic!("{other:?}"),
        }
        // Asking for more rows than there are keeps what there is.
        match dev.prefix(20, 4) {
            Captured::Device(d) => assert_eq!(d.rows, 8),
            other => panic!("{other:?}"),
        }
    }
}
