//! Sampled decoding: plain ([`sample`]) and lossless speculative ([`speculative_sampled`]),
//! with temperature, top-k, top-p and min-p from [`SamplingParams`] (Leviathan et al. / Chen et
//! al. speculative sampling, as DeepSpec's `verify_draft_tokens` runs it; SAMPLING.md §1).
//!
//! ```text
//! p'_i = transform(params, target row i)          the law every emitted token must follow
//! round: d_1..d_B, q_1..q_B = draft(anchor)       law Greedy: the argmax chain, q_s one-hot on d_s
//!                                                 law Sampled: d_s ~ q_s = transform(params,
//!                                                   lm_head(h_s) + Markov bias(d_{s-1})), d_0 = anchor
//!        k = verify_len(survival)                 (see "Verify length" below)
//!        rows 0..=k = target([anchor, d_1..d_k])  TargetModel::verify_sampled for one-hot drafts
//!                                                 or a block the draft sampled on the device
//!                                                 (CUDA: chain, ratio and draws all there,
//!                                                 bit-equal to the host rule), else host
//!                                                 logits (forward, All)
//!        for i in 0..k: accept d_{i+1} iff u_i < p'_i(d_{i+1}) / q_{i+1}(d_{i+1})
//!        first rejection at row m: emit x ~ norm(max(0, p'_m − q_{m+1}))   (one-hot q: p'_m without d)
//!        all k accepted:           emit x ~ p'_k                           (the bonus)
//!        an accepted eos ends the output there, with no bonus
//! ```
//!
//! Temperature 0 never reaches this loop: [`sample`] is [`greedy`] and [`speculative_sampled`]
//! is [`speculative`], bit for bit (tokens and stats).
//!
//! **Uniforms.** One stream per request, `Uniforms::new(params.seed)`, consumed in this fixed
//! order: one uniform for the prompt's token (the prefill's last row); then per round, (1) with
//! the sampled law, B uniforms for the draft's chain, one per slot in slot order (the greedy law
//! draws none), (2) k accept uniforms, one per verified row in row order, all k drawn whether or
//! not an earlier row rejected, (3) one uniform for the residual or bonus draw (drawn even when an
//! accepted eos makes it unused). Plain [`sample`] uses one uniform per token. A round's count is
//! fixed by B and k alone, so a replay (or a GPU kernel) can index the stream directly.
//!
//! **Verify length.** `k` never depends on a draw it admits. Fixed N depends on nothing. `auto`
//! ([`VerifyLen::choose`]) scans k = 0, 1, … and stops at the first k whose rate falls; draft
//! `d_j` is admitted iff the scan passes slot j, which reads survivals `a_0 .. a_{j−1}` only, and
//! `a_{j−1}` is a product of confidences of slots `< j`, each a function of the block's hidden
//! states and its previous token — so of `anchor, d_1 .. d_{j−1}`, never of `d_j`. Under the
//! sampled law the confidences are computed along the *sampled* chain (the head's Markov input
//! is the drawn token), which keeps this property: whether `d_j` is verified is decided before
//! `d_j`'s own value matters, as the paper's early-stopping scheduler requires (Appendix A). The
//! stop after `d_j` may depend on `d_j`; that only decides whether row j's bonus is drawn from
//! `p'_j` instead of testing `d_{j+1}`, and both give `p'_j`. Under the greedy law the block is a
//! function of the committed prefix, so no admission rule can leak verifier randomness at all.
//!
//! **Default law: [`DraftLaw::Sampled`]**, measured on the demo coder (12 held-out prompts ×
//! 3 seeds, 64 tokens, verify 7, `tests/sampled_acceptance.rs`, 2026-12-02): mean accepted
//! length (tokens per round, bonus counted; ~1,100 rounds per cell, standard error ≈ 0.04)
//!
//! | T | top-k | top-p | greedy law | sampled law |
//! |---|---|---|---|---|
//! | 0.7 | off | 1 | 2.03 | **2.11** |
//! | 1.0 | off | 1 | 1.78 | **2.03** |
//! | 0.7 | 20 | 0.8 | 2.18 | 2.13 |
//!
//! The sampled law wins at both asked temperatures (clearly at 1.0, where the one-hot draft
//! accepts only with p'(argmax)); at Qwen's recommended filters the two are within noise. A
//! drafter whose sampled block costs more than that gain says so
//! (`Drafter::prefers_sampled_block`: the CUDA draft, whose per-slot device sampler makes a
//! round ~1.1× a greedy one), and the CLI and server then default to the greedy law.

use crate::greedy::{check_prompt, greedy, GenerateOptions};
use crate::logprobs::{emitted, Emitted};
use crate::sampler::{draw, transform, SamplingParams, Uniforms};
use crate::speculative::speculative;
use crate::stats::{Generation, SpecStats, StopReason};
use crate::verify_len::VerifyLen;
use dspark_model::{Captured, Deferred, Drafter, Error, LogitRows, Proposal, Result, TargetModel, VerifyOutcome};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// How the draft picks its block under sampling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DraftLaw {
    /// One-hot draft q: the argmax chain, as greedy decoding proposes it.
    Greedy,
    /// `d_s` drawn from `q_s` along the Markov chain, `q_s` kept for the ratio (the default:
    /// measured the better of the two on the demo coder, see the module header).
    #[default]
    Sampled,
}

/// Deliberate bugs for the losslessness tests, which must catch each (kept as tests so the
/// statistical test's power stays proven). Not for use.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// The ratio and residual use q without the Markov bias (transform of the base logits),
    /// not the q the draft drew from (sampled law).
    QWithoutMarkovBias,
    /// The residual after a rejection is p' itself, q not subtracted.
    ResidualIsTarget,
    /// Draft `d_{i+1}` is judged against target row i + 1 instead of row i.
    OffByOneRow,
    /// The verify length peeks at the draws: it stops before the first draft that is not its
    /// slot's most likely token under q.
    PeekingVerifyLen,
}

/// Emits one token; returns the stop reason if generation must end after it (shared with
/// the greedy loops). The token's own reasons (eos, `max_tokens`) win over the callback's
/// `Break`, which ends generation with [`StopReason::Stopped`] otherwise.
pub(crate) fn emit(
    e: Emitted,
    tokens: &mut Vec<u32>,
    opts: &GenerateOptions,
    on_token: &mut impl FnMut(&Emitted) -> ControlFlow<()>,
) -> Option<StopReason> {
    let t = e.token;
    tokens.push(t);
    let flow = on_token(&e);
    if opts.eos_token_ids.contains(&t) {
        Some(StopReason::Eos)
    } else if tokens.len() >= opts.max_tokens {
        Some(StopReason::MaxTokens)
    } else if flow.is_break() {
        Some(StopReason::Stopped)
    } else {
        None
    }
}

fn checked(params: &SamplingParams) -> Result<()> {
    params.validate().map_err(Error::Request)
}

/// Plain sampled decoding (temperature 0 → exactly [`greedy`]'s tokens): each token drawn from
/// the request's transform of the last row, with the next uniform of the request's stream.
pub fn sample<T: TargetModel + ?Sized>(
    target: &mut T,
    prompt: &[u32],
    opts: &GenerateOptions,
    params: &SamplingParams,
    mut on_token: impl FnMut(&Emitted) -> ControlFlow<()>,
) -> Result<Generation> {
    checked(params)?;
    if params.is_greedy() {
        return greedy(target, prompt, opts, on_token);
    }
    check_prompt(target, prompt)?;
    target.truncate(0)?;
    let vocab = target.config().vocab_size;
    let mut u = Uniforms::new(params.seed);
    let start = Instant::now();
    let lp = opts.logprobs;
    let first = u.next_uniform();
    let mut next = if lp.is_none() {
        // The CUDA target draws the first token on the device as well.
        emitted(target.prefill_sampled(prompt, &params.filters(), first)?.0, None, lp)
    } else {
        let f = target.forward(prompt, LogitRows::Last)?;
        emitted(draw(&transform(params, f.row(0, vocab)), first), Some(f.row(0, vocab)), lp)
    };
    let prefill = start.elapsed();
    let decode_start = Instant::now();
    let mut tokens = Vec::new();
    let stop = if opts.max_tokens == 0 {
        StopReason::MaxTokens
    } else {
        loop {
            if let Some(stop) = emit(next, &mut tokens, opts, &mut on_token) {
                break stop;
            }
            if target.len() >= target.max_len() {
                break StopReason::ContextFull;
            }
            let last = *tokens.last().expect("a token was emitted");
            let uniform = u.next_uniform();
            next = if lp.is_none() {
                // A verify of no drafts: the CUDA target draws on the device.
                let v = target.verify_sampled(
                    last,
                    &Deferred::Ready(Proposal::default()),
                    0,
                    &params.filters(),
                    &[uniform],
                )?;
                match v.outcome {
                    VerifyOutcome::Drawn { next, .. } => emitted(next, None, lp),
                    VerifyOutcome::Logits(l) => emitted(draw(&transform(params, &l[..vocab]), uniform), None, lp),
                }
            } else {
                let f = target.forward(&[last], LogitRows::Last)?;
                emitted(draw(&transform(params, f.row(0, vocab)), uniform), Some(f.row(0, vocab)), lp)
            };
        }
    };
    let decode = if tokens.len() > 1 { decode_start.elapsed() } else { Duration::ZERO };
    Ok(Generation { tokens, stop, prompt_tokens: prompt.len(), prefill, decode, spec: None })
}

/// Lossless speculative sampling (temperature 0 → exactly [`speculative`]'s tokens and stats).
#[allow(clippy::too_many_arguments)]
pub fn speculative_sampled<T: TargetModel + ?Sized, D: Drafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    prompt: &[u32],
    opts: &GenerateOptions,
    verify_len: &VerifyLen,
    params: &SamplingParams,
    law: DraftLaw,
    on_token: impl FnMut(&Emitted) -> ControlFlow<()>,
) -> Result<Generation> {
    speculative_sampled_with_fault(target, draft, prompt, opts, verify_len, params, law, Fault::None, on_token)
}

/// [`speculative_sampled`] with a deliberate [`Fault`] (tests only).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn speculative_sampled_with_fault<T: TargetModel + ?Sized, D: Drafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    prompt: &[u32],
    opts: &GenerateOptions,
    verify_len: &VerifyLen,
    params: &SamplingParams,
    law: DraftLaw,
    fault: Fault,
    mut on_token: impl FnMut(&Emitted) -> ControlFlow<()>,
) -> Result<Generation> {
    checked(params)?;
    if params.is_greedy() {
        return speculative(target, draft, prompt, opts, verify_len, on_token);
    }
    check_prompt(target, prompt)?;
    let block = draft.block_size();
    let vocab = target.config().vocab_size;
    let row_len = draft.target_layer_ids().len() * target.config().hidden_size;
    target.truncate(0)?;
    target.set_capture(draft.target_layer_ids())?;
    draft.reset();
    let mut u = Uniforms::new(params.seed);

    // Prefill in the target's chunks (as `crate::prefill`), the last chunk's row sampled.
    let start = Instant::now();
    let lp = opts.logprobs;
    let (first, mut pending) = {
        let mut chunks = prompt.chunks(target.prefill_chunk().max(1)).peekable();
        loop {
            let chunk = chunks.next().ok_or_else(|| Error::Request("empty prompt".into()))?;
            if chunks.peek().is_some() {
                let g = target.forward_greedy(chunk, LogitRows::Last)?;
                draft.append_captured(&g.captured)?;
                continue;
            }
            let first = u.next_uniform();
            if lp.is_none() {
                let (t, captured) = target.prefill_sampled(chunk, &params.filters(), first)?;
                break (emitted(t, None, lp), captured);
            }
            let f = target.forward(chunk, LogitRows::Last)?;
            let row = f.row(f.rows - 1, vocab);
            let t = draw(&transform(params, row), first);
            break (emitted(t, Some(row), lp), Captured::Host(f.captured));
        }
    };
    let prefill = start.elapsed();
    let decode_start = Instant::now();

    let mut tokens: Vec<u32> = Vec::new();
    let mut stats = SpecStats::new(block);
    let stop = 'gen: {
        if opts.max_tokens == 0 {
            break 'gen StopReason::MaxTokens;
        }
        let mut anchor = first.token;
        if let Some(stop) = emit(first, &mut tokens, opts, &mut on_token) {
            break 'gen stop;
        }
        loop {
            let p = target.len();
            if p >= target.max_len() {
                break 'gen StopReason::ContextFull;
            }
            draft.append_captured(&pending)?;
            // The block, and for the sampled law the q row each draft was drawn from. A greedy
            // block with a fixed verify length may stay on the GPU for the device sampler.
            let (deferred, q, survival, base) = match law {
                DraftLaw::Greedy => match verify_len {
                    VerifyLen::Fixed(_) if opts.logprobs.is_none() => {
                        (draft.propose_deferred(anchor)?, None, None, None)
                    }
                    _ => {
                        let prop = draft.propose(anchor)?;
                        let survival = prop.survival.clone();
                        (Deferred::Ready(prop), None, survival, None)
                    }
                },
                DraftLaw::Sampled => {
                    // The chain's B uniforms, in slot order, whichever path draws with them.
                    let chain: Vec<f64> = (0..block).map(|_| u.next_uniform()).collect();
                    let on_device = if opts.logprobs.is_none() && fault == Fault::None {
                        draft.propose_sampled_device(anchor, &params.filters(), &chain)?
                    } else {
                        None
                    };
                    match on_device {
                        // Drawn on the GPU: the tokens and their q rows stay there for the verify.
                        Some(ds) => (Deferred::OnDevice(ds.tokens), None, ds.survival, None),
                        None => {
                            let mut slot = chain.iter().copied();
                            let sp = draft.propose_sampled(anchor, &mut |z: &[f32]| {
                                let q = transform(params, z);
                                // A draft calls once per slot; a surplus call (a drafter bug)
                                // draws 0 and is caught by the length check below.
                                (draw(&q, slot.next().unwrap_or(0.0)), q)
                            })?;
                            if sp.tokens.len() != block {
                                return Err(Error::Request(format!(
                                    "the draft drew {} tokens for a block of {block}",
                                    sp.tokens.len()
                                )));
                            }
                            let prop = Proposal { tokens: sp.tokens, survival: None };
                            (Deferred::Ready(prop), Some(sp.q), sp.survival, sp.base_logits)
                        }
                    }
                }
            };
            let proposed = match &deferred {
                Deferred::Ready(p) => p.tokens.len(),
                Deferred::OnDevice(d) => d.len,
            };
            if proposed < block || q.as_ref().is_some_and(|q| q.len() < block) {
                return Err(Error::Request(format!("the draft proposed {proposed} of {block} tokens")));
            }
            let room = target.max_len() - p - 1;
            let wanted = opts.max_tokens - tokens.len() - 1;
            let mut k = verify_len.choose(survival.as_deref(), block).min(room).min(wanted);
            if fault == Fault::PeekingVerifyLen {
                if let (Some(q), Deferred::Ready(prop)) = (&q, &deferred) {
                    let peek = (0..k).take_while(|&i| argmax_f64(&q[i]) == prop.tokens[i] as usize).count();
                    k = k.min(peek);
                }
            }
            // The q used in the ratio and the residual (the drawn-from rows, unless broken).
            let q_used: Option<Vec<Vec<f64>>> = match (fault, &base) {
                (Fault::QWithoutMarkovBias, Some(b)) if q.is_some() => {
                    Some((0..block).map(|s| transform(params, &b[s * vocab..][..vocab])).collect())
                }
                _ => q,
            };
            let mut us: Vec<f64> = (0..k).map(|_| u.next_uniform()).collect();
            us.push(u.next_uniform());

            // Without logprobs, one-hot drafts or a block sampled on the device: the target may
            // decide the round itself (the CUDA target's device sampler, the same bits as the
            // host rule below); otherwise, or when it hands back its rows, the host rule runs on
            // the logits.
            let (decided, logits, captured) = if q_used.is_none() && opts.logprobs.is_none() {
                let v = target.verify_sampled(anchor, &deferred, k, &params.filters(), &us)?;
                match v.outcome {
                    VerifyOutcome::Drawn { accepted, next } => (Some((accepted, next)), None, v.captured),
                    VerifyOutcome::Logits(l) => (None, Some(l), v.captured),
                }
            } else {
                let Deferred::Ready(prop) = &deferred else {
                    unreachable!("device blocks are proposed only without logprobs or host q")
                };
                let mut input = Vec::with_capacity(k + 1);
                input.push(anchor);
                input.extend_from_slice(&prop.tokens[..k]);
                let f = target.forward(&input, LogitRows::All)?;
                (None, Some(f.logits), Captured::Host(f.captured))
            };
            // A device-sampled block handed back with the target's rows (its sampler could not
            // finish the round): the host rule takes q from the rows the draft drew from.
            let device_q = match (&deferred, &logits) {
                (Deferred::OnDevice(d), Some(_)) if d.sampled => {
                    let z = draft.sampled_logits(d)?;
                    Some((0..block).map(|s| transform(params, &z[s * vocab..(s + 1) * vocab])).collect::<Vec<_>>())
                }
                _ => None,
            };
            let drafts = draft.finish_proposal(deferred)?.tokens;
            let (m, next) = match (decided, &logits) {
                (Some(d), _) => d,
                (None, Some(l)) => {
                    let row = |i: usize| &l[i * vocab..(i + 1) * vocab];
                    let q = q_used.as_deref().or(device_q.as_deref());
                    host_rule(params, &row, &drafts[..k], q, &us, fault)
                }
                (None, None) => unreachable!("a round is decided or has logits"),
            };
            stats.record(k, m);

            target.truncate(p + m + 1)?;
            // Accepted d_{i+1} came from row i, the residual or bonus from row m.
            for (i, &t) in drafts[..m].iter().chain(std::iter::once(&next)).enumerate() {
                let row = logits.as_ref().map(|l| &l[i * vocab..(i + 1) * vocab]);
                if let Some(stop) = emit(emitted(t, row, lp), &mut tokens, opts, &mut on_token) {
                    break 'gen stop;
                }
            }
            pending = captured.prefix(m + 1, row_len);
            anchor = next;
        }
    };
    let decode = decode_start.elapsed();
    Ok(Generation { tokens, stop, prompt_tokens: prompt.len(), prefill, decode, spec: Some(stats) })
}

/// The speculative sampling rule on host logits (`row(i)` = target row i): accept `d_{i+1}`
/// iff `u_i < p'_i(d) / q_{i+1}(d)` (q one-hot when `q` is `None`), then draw with `u[k]` from
/// the first rejecting row's residual or from row k. Returns (accepted, next token).
fn host_rule<'a>(
    params: &SamplingParams,
    row: &dyn Fn(usize) -> &'a [f32],
    drafts: &[u32],
    q: Option<&[Vec<f64>]>,
    u: &[f64],
    fault: Fault,
) -> (usize, u32) {
    let k = drafts.len();
    for i in 0..k {
        let r = if fault == Fault::OffByOneRow { (i + 1).min(k) } else { i };
        let pp = transform(params, row(r));
        let d = drafts[i] as usize;
        let qd = q.map_or(1.0, |q| q[i][d]);
        if qd > 0.0 && u[i] < pp[d] / qd {
            continue;
        }
        let mut residual = match (fault, q) {
            (Fault::ResidualIsTarget, _) => pp.clone(),
            (_, None) => {
                let mut r = pp.clone();
                r[d] = 0.0;
                r
            }
            (_, Some(q)) => pp.iter().zip(&q[i]).map(|(a, b)| (a - b).max(0.0)).collect(),
        };
        if residual.iter().sum::<f64>() <= 0.0 {
            // No mass left (p' ≤ q everywhere up to rounding): p' itself.
            residual = pp;
        }
        return (i, draw(&residual, u[k]));
    }
    (k, draw(&transform(params, row(k)), u[k]))
}

/// The speculative sampling rule on a verify's host logits `[k + 1, vocab]`, `us` its k + 1
/// uniforms, the drafts one-hot (greedy draft law, `q` `None`) or drawn from `q` (sampled law):
/// (accepted, next token) — the rule of [`speculative_sampled`]'s host path, for the batched
/// rounds.
pub(crate) fn judge(
    params: &SamplingParams,
    logits: &[f32],
    vocab: usize,
    drafts: &[u32],
    q: Option<&[Vec<f64>]>,
    us: &[f64],
) -> (usize, u32) {
    let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
    host_rule(params, &row, drafts, q, us, Fault::None)
}

/// The most likely token of a distribution (lowest index on ties).
fn argmax_f64(p: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in p.iter().enumerate() {
        if x > p[best] {
            best = i;
        }
    }
    best
}
