//! DSpark decoding of many requests at once: continuous batching of speculative rounds
//! (issue #30), over [`BatchTarget`] / [`BatchDrafter`], greedy or sampled per request.
//!
//! ```text
//! round:  admit arrived requests while fewer than max_batch are active (their prompts join
//!         this round's forward);
//!         for each decoding request r: draft.append_captured(r, pending_r);
//!         d_r = draft.propose_batch(r, a_r)                     # one draft pass for all
//!         ℓ_r = verify length: fixed, or verify_budget over all r's survival   # Algorithm 1
//!         one target forward over every item: [a_r, d_r,1..d_r,ℓ] for decoding r, the prompt for
//!         a new one — each against its own sequence
//!         per decoding r: m = longest prefix with d_r,i+1 == g_r,i; emit d_r,1..d_r,m, g_r,m;
//!         rollback r to p_r + m + 1; pending_r = F'_r[0..=m]; a_r = g_r,m
//!         per new r: a_r = argmax of the prompt's last row; emit it; pending_r = the prompt's F
//!         finished requests close their sequences (their pages return to the pool)
//! ```
//!
//! Each request's round is exactly [`speculative`](crate::speculative)'s round on its own
//! sequence, so its output equals plain greedy decoding of its prompt alone, whoever shares the
//! batch and whatever the budget admits (tests/batched.rs checks it with random arrivals). A
//! request's prompt goes through in one item, or in chunks of one per round
//! ([`Scheduler::with_prefill_chunk`]) so that a long prompt does not stall the others' tokens.
//!
//! A sampled request ([`Scheduler::submit_sampled`]) runs [`speculative_sampled`]'s round under
//! the scheduler's draft law ([`Scheduler::with_draft_law`]; greedy by default): its rows'
//! logits come back to the host (`forward_batch_logits`), and the speculative sampling rule
//! judges its drafts — one-hot, or drawn along the Markov chain from q rows kept for the ratio
//! (that draft pass runs for the request alone) — with uniforms drawn from its own stream in the
//! same order (the prompt's token first; a round: the chain's B under the sampled law, then
//! k + 1). Its verify length
//! is always the fixed one (the block, or `Fixed(n)`), never the budget's: then its draws, and
//! so its tokens, are those of its solo run with that fixed length whoever shares the batch
//! (the same seed gives the same text), and the length cannot depend on the draws it admits.
//!
//! [`Scheduler`] is the loop as a server drives it: `submit` any time, `step` runs one round
//! and reports each committed token to a callback (whose `Break` stops that request, as the
//! single-request loops' `on_token` does), `cancel` frees a request's sequences at once.
//! [`batched`] drives it over a list of requests with arrival rounds.

use crate::greedy::GenerateOptions;
use crate::logprobs::emitted;
use crate::sampled::{emit, judge, DraftLaw};
use crate::sampler::{draw, transform, SamplingParams, Uniforms};
use crate::stats::{SpecStats, StopReason};
use crate::verify_budget::verify_budget;
use crate::verify_len::CostTable;
use crate::Emitted;
use dspark_model::{BatchDrafter, BatchTarget, Captured, Error, Greedy, LogitRows, Proposal, Result, SeqId};
use std::ops::ControlFlow;

mod admission;
mod run;
pub use run::{batched, BatchLimits, BatchRequest};

/// How many drafts each decoding request verifies in a round.
#[derive(Clone, Debug, PartialEq)]
pub enum BatchVerify {
    /// `min(N, B)` each.
    Fixed(usize),
    /// The paper's budget over every request's prefix survival ([`verify_budget`]); `seconds[n -
    /// 1]` the time of a forward of n verify tokens. Without a confidence head, full blocks.
    Budget(CostTable),
}

/// What one request produced.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOutput {
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    /// The round of its first forward and of its last.
    pub rounds: (usize, usize),
    /// Drafts verified and accepted in each of its decoding rounds.
    pub spec: SpecStats,
}

/// A request in flight.
struct Active {
    id: usize,
    tid: SeqId,
    did: SeqId,
    tokens: Vec<u32>,
    /// The newest token, not yet in the target's cache; `None` until the prompt has run.
    anchor: Option<u32>,
    pending: Captured,
    /// Prompt tokens already in the target's cache (while `anchor` is `None`).
    prefilled: usize,
    /// KV positions it reserved at admission (see [`Scheduler::with_kv_capacity`]).
    reserved: usize,
    first_round: usize,
    prompt: Vec<u32>,
    opts: GenerateOptions,
    /// The request's sampler and its uniform stream (`None`: greedy).
    sampling: Option<(SamplingParams, Uniforms)>,
    stats: SpecStats,
}

/// What [`Scheduler::step`] reports about a request that ended in its round.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// The id [`Scheduler::submit`] returned.
    pub id: usize,
    pub output: BatchOutput,
}

/// Continuous batching as a server drives it (see the module docs).
pub struct Scheduler {
    verify: BatchVerify,
    max_batch: usize,
    /// KV positions the running requests may hold together (`None`: no limit but the target's
    /// own pages), and how many their reservations take now.
    kv_capacity: Option<usize>,
    reserved: usize,
    /// Prompt tokens a request puts through one round's forward (`None`: its whole prompt).
    prefill_chunk: Option<usize>,
    /// Whether the target captures the draft's taps yet (set on the first round; a scheduler
    /// serves one target and draft).
    capture_set: bool,
    /// Submitted, not yet admitted: (id, prompt, options, sampler), in submission order.
    waiting: std::collections::VecDeque<(usize, Vec<u32>, GenerateOptions, SamplingParams)>,
    active: Vec<Active>,
    next_id: usize,
    round: usize,
    /// How sampled requests' drafts are picked.
    law: DraftLaw,
}

impl Scheduler {
    /// A scheduler running at most `max_batch` requests in a round.
    pub fn new(verify: BatchVerify, max_batch: usize) -> Result<Scheduler> {
        if max_batch == 0 {
            return Err(Error::Request("max_batch must be at least 1".into()));
        }
        Ok(Scheduler {
            verify,
            max_batch,
            kv_capacity: None,
            reserved: 0,
            prefill_chunk: None,
            capture_set: false,
            waiting: Default::default(),
            active: Vec::new(),
            next_id: 0,
            round: 0,
            law: DraftLaw::Greedy,
        })
    }

    /// Sampled requests' drafts drawn under `law` (the single-request loop's `DraftLaw`).
    pub fn with_draft_law(mut self, law: DraftLaw) -> Scheduler {
        self.law = law;
        self
    }

    /// Splits prompts into chunks of at most `tokens` (≥ 1), one chunk a round, so a long prompt
    /// shares each round with the others' verify rows instead of stalling them for its whole
    /// length. Each chunk's captured rows go to the draft as they come (as
    /// [`prefill`](crate::prefill) does); the last chunk gives the first token.
    pub fn with_prefill_chunk(mut self, tokens: usize) -> Scheduler {
        self.prefill_chunk = Some(tokens.max(1));
        self
    }

    /// Queues a greedy request (checked here: a prompt the target can hold); returns its id.
    pub fn submit<T: BatchTarget + ?Sized>(
        &mut self,
        target: &T,
        prompt: Vec<u32>,
        opts: GenerateOptions,
    ) -> Result<usize> {
        self.submit_sampled(target, prompt, opts, SamplingParams::greedy())
    }

    /// Queues a request decoded with `params` (temperature 0: greedy; see the module docs for a
    /// sampled one); returns its id.
    pub fn submit_sampled<T: BatchTarget + ?Sized>(
        &mut self,
        target: &T,
        prompt: Vec<u32>,
        opts: GenerateOptions,
        params: SamplingParams,
    ) -> Result<usize> {
        params.validate().map_err(Error::Request)?;
        if prompt.is_empty() || prompt.len() > target.max_len() {
            return Err(Error::Request(format!(
                "prompt of {} tokens: the target holds 1 ..= {}",
                prompt.len(),
                target.max_len()
            )));
        }
        let (need, cap) = self.reservation(target, prompt.len(), &opts);
        if let Some(cap) = cap.filter(|&cap| need > cap) {
            let asked = (prompt.len() + opts.max_tokens).min(target.max_len());
            let pages = match target.kv_budget() {
                Some(b) if asked != need => format!(" ({need} in whole pages of {})", b.page),
                _ => String::new(),
            };
            return Err(Error::Request(format!(
                "prompt + max_tokens = {asked} KV positions{pages}, more than the capacity of {cap}"
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((id, prompt, opts, params));
        Ok(id)
    }

    /// Whether no request is queued or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty()
    }

    /// Requests running now.
    pub fn running(&self) -> usize {
        self.active.len()
    }

    /// Requests submitted and not yet admitted (waiting for a slot or for KV capacity).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Rounds run so far.
    pub fn round(&self) -> usize {
        self.round
    }

    /// Drops request `id` wherever it is, freeing its sequences; its tokens so far are returned
    /// (`None` if it is unknown or already finished).
    pub fn cancel<T: BatchTarget + ?Sized, D: BatchDrafter + ?Sized>(
        &mut self,
        target: &mut T,
        draft: &mut D,
        id: usize,
    ) -> Result<Option<Vec<u32>>> {
        if let Some(w) = self.waiting.iter().position(|w| w.0 == id) {
            self.waiting.remove(w);
            return Ok(Some(Vec::new()));
        }
        let Some(a) = self.active.iter().position(|a| a.id == id) else { return Ok(None) };
        let s = self.active.remove(a);
        self.reserved -= s.reserved;
        target.close(s.tid)?;
        draft.close(s.did)?;
        Ok(Some(s.tokens))
    }

    /// One round (see the module docs): admits queued requests while fewer than `max_batch` run,
    /// runs the draft pass and one target forward, commits each request's tokens through
    /// `on_token(id, token)` and returns the requests that ended, their sequences closed.
    pub fn step<T: BatchTarget + ?Sized, D: BatchDrafter + ?Sized>(
        &mut self,
        target: &mut T,
        draft: &mut D,
        mut on_token: impl FnMut(usize, &Emitted) -> ControlFlow<()>,
    ) -> Result<Vec<Finished>> {
        let block = draft.block_size();
        let row = draft.target_layer_ids().len() * target.config().hidden_size;
        // Once: a CUDA target drops its captured graphs whenever its capture list is set.
        if !self.capture_set {
            target.set_capture(draft.target_layer_ids())?;
            self.capture_set = true;
        }
        while self.active.len() < self.max_batch {
            let Some((_, prompt, opts, _)) = self.waiting.front() else { break };
            let (need, cap) = self.reservation(target, prompt.len(), opts);
            if cap.is_some_and(|cap| self.reserved + need > cap) {
                break;
            }
            self.reserved += need;
            let Some((id, prompt, opts, params)) = self.waiting.pop_front() else { break };
            let (tid, did) = (target.open()?, draft.open()?);
            let pending = Captured::Host(Vec::new());
            let s = Active {
                id,
                tid,
                did,
                tokens: Vec::new(),
                anchor: None,
                pending,
                prefilled: 0,
                reserved: need,
                first_round: self.round,
                prompt,
                opts,
                sampling: (!params.is_greedy()).then(|| (params, Uniforms::new(params.seed))),
                stats: SpecStats::new(block),
            };
            self.active.push(s);
        }
        if self.active.is_empty() {
            return Ok(Vec::new());
        }
        let active = &mut self.active;

        // The draft's pass for every decoding request, then each one's verify length.
        let decoding: Vec<usize> = (0..active.len()).filter(|&a| active[a].anchor.is_some()).collect();
        for &a in &decoding {
            draft.append_captured(active[a].did, &active[a].pending)?;
        }
        // Sampled requests under the sampled law draw their blocks alone (each slot from its q
        // row, with the chain's uniforms); every other block comes from one batched pass.
        let chained: Vec<bool> =
            decoding.iter().map(|&a| self.law == DraftLaw::Sampled && active[a].sampling.is_some()).collect();
        let items: Vec<(SeqId, u32)> = decoding
            .iter()
            .zip(&chained)
            .filter(|(_, &c)| !c)
            .map(|(&a, _)| (active[a].did, active[a].anchor.unwrap_or(0)))
            .collect();
        let mut batch_props = draft.propose_batch(&items)?.into_iter();
        let mut proposals: Vec<Proposal> = Vec::with_capacity(decoding.len());
        let mut qs: Vec<Option<Vec<Vec<f64>>>> = Vec::with_capacity(decoding.len());
        for (&a, &c) in decoding.iter().zip(&chained) {
            if !c {
                proposals.push(batch_props.next().ok_or_else(|| Error::Request("a proposal is missing".into()))?);
                qs.push(None);
                continue;
            }
            let s = &mut active[a];
            let (params, u) = s.sampling.as_mut().ok_or_else(|| Error::Request("sampler missing".into()))?;
            let chain: Vec<f64> = (0..block).map(|_| u.next_uniform()).collect();
            let mut got = None;
            let anchor = s.anchor.unwrap_or(0);
            draft.with_draft(s.did, &mut |d| {
                let mut slot = chain.iter().copied();
                let params = *params;
                got = Some(d.propose_sampled(anchor, &mut |z: &[f32]| {
                    let q = transform(&params, z);
                    (draw(&q, slot.next().unwrap_or(0.0)), q)
                })?);
                Ok(())
            })?;
            let sp = got.ok_or_else(|| Error::Request("the draft did not propose".into()))?;
            if sp.tokens.len() != block || sp.q.len() != block {
                return Err(Error::Request(format!(
                    "the draft drew {} tokens for a block of {block}",
                    sp.tokens.len()
                )));
            }
            proposals.push(Proposal { tokens: sp.tokens, survival: sp.survival });
            qs.push(Some(sp.q));
        }
        let fixed = match &self.verify {
            BatchVerify::Fixed(n) => (*n).min(block),
            BatchVerify::Budget(_) => block,
        };
        let mut ks: Vec<usize> = match &self.verify {
            BatchVerify::Fixed(_) => vec![fixed; decoding.len()],
            BatchVerify::Budget(costs) => {
                match proposals.iter().map(|p| p.survival.as_deref()).collect::<Option<Vec<_>>>() {
                    Some(survival) => verify_budget(&survival, &vec![block; decoding.len()], costs),
                    None => vec![block; decoding.len()],
                }
            }
        };
        // Sampled requests verify the fixed length (see the module docs).
        for (i, &a) in decoding.iter().enumerate() {
            if active[a].sampling.is_some() {
                ks[i] = fixed;
            }
        }
        // Never verify past a request's context, nor more drafts than tokens it still wants.
        let mut lens = Vec::with_capacity(decoding.len());
        for (i, &a) in decoding.iter().enumerate() {
            let p = target.seq_len(active[a].tid)?;
            let wanted = active[a].opts.max_tokens.saturating_sub(active[a].tokens.len() + 1);
            ks[i] = ks[i].min(target.max_len().saturating_sub(p + 1)).min(wanted);
            lens.push(p);
        }

        // One target forward over every request's rows.
        let slot = |a: usize| decoding.iter().position(|&d| d == a);
        let inputs: Vec<Vec<u32>> = (0..active.len())
            .map(|a| match (active[a].anchor, slot(a)) {
                (Some(anchor), Some(i)) => {
                    std::iter::once(anchor).chain(proposals[i].tokens[..ks[i]].iter().copied()).collect()
                }
                _ => {
                    let (done, prompt) = (active[a].prefilled, &active[a].prompt);
                    let end = self.prefill_chunk.map_or(prompt.len(), |c| (done + c).min(prompt.len()));
                    prompt[done..end].to_vec()
                }
            })
            .collect();
        let batch: Vec<(SeqId, &[u32], LogitRows)> = active
            .iter()
            .zip(&inputs)
            .map(|(s, t)| (s.tid, t.as_slice(), if s.anchor.is_some() { LogitRows::All } else { LogitRows::Last }))
            .collect();
        // Sampled requests' rows, and those of requests reporting logprobs, come back as logits
        // (a prompt's only at its last chunk).
        let wants: Vec<bool> = active
            .iter()
            .zip(&inputs)
            .map(|(s, t)| {
                (s.sampling.is_some() || s.opts.logprobs.is_some())
                    && (s.anchor.is_some() || s.prefilled + t.len() == s.prompt.len())
            })
            .collect();
        let results: Vec<(Greedy, Vec<f32>)> = if wants.iter().any(|&w| w) {
            target.forward_batch_logits(&batch, &wants)?
        } else {
            target.forward_batch(&batch)?.into_iter().map(|g| (g, Vec::new())).collect()
        };
        let vocab = target.config().vocab_size;

        let mut ended = Vec::new();
        for (a, (f, logits)) in results.into_iter().enumerate() {
            let s = &mut active[a];
            let id = s.id;
            if s.anchor.is_none() && s.prefilled + inputs[a].len() < s.prompt.len() {
                // A prompt chunk before the last: its rows go to the draft now.
                s.prefilled += inputs[a].len();
                draft.append_captured(s.did, &f.captured)?;
                continue;
            }
            let mut sink = |e: &Emitted| on_token(id, e);
            let stop = match (s.anchor, slot(a)) {
                (Some(_), Some(i)) => {
                    let (k, p) = (ks[i], lens[i]);
                    let drafts = &proposals[i].tokens[..k];
                    // The committed tokens: the agreeing drafts and the target's next (greedy),
                    // or what the sampling rule accepts and draws (sampled).
                    let (m, next) = match &mut s.sampling {
                        None => {
                            let m = (0..k).take_while(|&j| drafts[j] == f.ids[j]).count();
                            (m, f.ids[m])
                        }
                        Some((params, u)) => {
                            let us: Vec<f64> = (0..=k).map(|_| u.next_uniform()).collect();
                            judge(params, &logits, vocab, drafts, qs[i].as_deref(), &us)
                        }
                    };
                    s.stats.record(k, m);
                    target.truncate(s.tid, p + m + 1)?;
                    s.pending = f.captured.prefix(m + 1, row);
                    s.anchor = Some(next);
                    let committed: Vec<u32> = drafts[..m].iter().copied().chain(std::iter::once(next)).collect();
                    // Accepted d_{i+1} and the next token came from row i (logprobs from its logits).
                    let mut stop = None;
                    for (i, &t) in committed.iter().enumerate() {
                        let e = emitted(t, logits.get(i * vocab..(i + 1) * vocab), s.opts.logprobs);
                        stop = emit(e, &mut s.tokens, &s.opts, &mut sink);
                        if stop.is_some() {
                            break;
                        }
                    }
                    stop
                }
                _ => {
                    let first = match &mut s.sampling {
                        None => *f.ids.last().ok_or_else(|| Error::Request("no logits row".into()))?,
                        Some((params, u)) => {
                            let row = logits.get(..vocab).ok_or_else(|| Error::Request("no logits row".into()))?;
                            draw(&transform(params, row), u.next_uniform())
                        }
                    };
                    s.pending = f.captured;
                    s.anchor = Some(first);
                    if s.opts.max_tokens == 0 {
                        Some(StopReason::MaxTokens)
                    } else {
                        let e = emitted(first, logits.get(..vocab), s.opts.logprobs);
                        emit(e, &mut s.tokens, &s.opts, &mut sink)
                    }
                }
            };
            let stop = match stop {
                None if target.seq_len(s.tid)? >= target.max_len() => Some(StopReason::ContextFull),
                other => other,
            };
            if let Some(stop) = stop {
                let output = BatchOutput {
                    tokens: std::mem::take(&mut s.tokens),
                    stop,
                    rounds: (s.first_round, self.round),
                    spec: std::mem::replace(&mut s.stats, SpecStats::new(block)),
                };
                ended.push((a, Finished { id, output }));
            }
        }
        let mut finished = Vec::with_capacity(ended.len());
        for (a, f) in ended.into_iter().rev() {
            let s = self.active.remove(a);
            self.reserved -= s.reserved;
            target.close(s.tid)?;
            draft.close(s.did)?;
            finished.push(f);
        }
        finished.reverse();
        self.round += 1;
        Ok(finished)
    }
}
