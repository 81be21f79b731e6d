//! Greedy DSpark decoding of many requests at once: continuous batching of speculative rounds
//! (issue #30), over [`BatchTarget`] / [`BatchDrafter`].
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
//! request's prompt goes through in one item; chunking long prompts across rounds is left to the
//! backend that needs it (the CUDA one).

use crate::greedy::GenerateOptions;
use crate::sampled::emit;
use crate::stats::StopReason;
use crate::verify_budget::verify_budget;
use crate::verify_len::CostTable;
use dspark_model::{BatchDrafter, BatchTarget, Captured, Error, LogitRows, Result, SeqId};
use std::ops::ControlFlow;

/// One request of a batched run: its prompt, its options (greedy: `logprobs` must be `None`), and
/// the round at which it arrives.
#[derive(Clone, Debug)]
pub struct BatchRequest {
    pub prompt: Vec<u32>,
    pub opts: GenerateOptions,
    pub arrival: usize,
}

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
}

/// A request in flight.
struct Active {
    req: usize,
    tid: SeqId,
    did: SeqId,
    tokens: Vec<u32>,
    /// The newest token, not yet in the target's cache; `None` until the prompt has run.
    anchor: Option<u32>,
    pending: Captured,
    first_round: usize,
}

/// Runs every request to its end, at most `max_batch` at a time, admitted in arrival order.
pub fn batched<T: BatchTarget + ?Sized, D: BatchDrafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    requests: &[BatchRequest],
    verify: &BatchVerify,
    max_batch: usize,
) -> Result<Vec<BatchOutput>> {
    for (i, r) in requests.iter().enumerate() {
        if r.prompt.is_empty() || r.prompt.len() > target.max_len() {
            return Err(Error::Request(format!("request {i}: prompt of {} tokens", r.prompt.len())));
        }
        if r.opts.logprobs.is_some() {
            return Err(Error::Request(format!("request {i}: batched decoding reports no logprobs")));
        }
    }
    if max_batch == 0 {
        return Err(Error::Request("max_batch must be at least 1".into()));
    }
    let block = draft.block_size();
    let row = draft.target_layer_ids().len() * target.config().hidden_size;
    target.set_capture(draft.target_layer_ids())?;
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| (requests[i].arrival, i));
    let mut waiting = order.into_iter().peekable();
    let mut active: Vec<Active> = Vec::new();
    let mut out: Vec<Option<BatchOutput>> = vec![None; requests.len()];
    let mut round = 0usize;
    let mut no_op = |_: &crate::Emitted| ControlFlow::Continue(());

    loop {
        while active.len() < max_batch && waiting.peek().is_some_and(|&i| requests[i].arrival <= round) {
            let req = waiting.next().expect("peeked");
            let (tid, did) = (target.open()?, draft.open()?);
            let pending = Captured::Host(Vec::new());
            active.push(Active { req, tid, did, tokens: Vec::new(), anchor: None, pending, first_round: round });
        }
        if active.is_empty() {
            match waiting.peek() {
                Some(&i) => {
                    round = requests[i].arrival;
                    continue;
                }
                None => break,
            }
        }

        // The draft's pass for every decoding request, then each one's verify length.
        let decoding: Vec<usize> = (0..active.len()).filter(|&a| active[a].anchor.is_some()).collect();
        for &a in &decoding {
            draft.append_captured(active[a].did, &active[a].pending)?;
        }
        let items: Vec<(SeqId, u32)> =
            decoding.iter().map(|&a| (active[a].did, active[a].anchor.unwrap_or(0))).collect();
        let proposals = draft.propose_batch(&items)?;
        let mut ks: Vec<usize> = match verify {
            BatchVerify::Fixed(n) => vec![(*n).min(block); decoding.len()],
            BatchVerify::Budget(costs) => {
                match proposals.iter().map(|p| p.survival.as_deref()).collect::<Option<Vec<_>>>() {
                    Some(survival) => verify_budget(&survival, &vec![block; decoding.len()], costs),
                    None => vec![block; decoding.len()],
                }
            }
        };
        // Never verify past a request's context, nor more drafts than tokens it still wants.
        let mut lens = Vec::with_capacity(decoding.len());
        for (i, &a) in decoding.iter().enumerate() {
            let p = target.seq_len(active[a].tid)?;
            let wanted = requests[active[a].req].opts.max_tokens.saturating_sub(active[a].tokens.len() + 1);
            ks[i] = ks[i].min(target.max_len().saturating_sub(p + 1)).min(wanted);
            lens.push(p);
        }

        // One target forward over every request's rows.
        let inputs: Vec<Vec<u32>> = active
            .iter()
            .map(|s| match s.anchor {
                None => requests[s.req].prompt.clone(),
                Some(anchor) => {
                    let i = decoding.iter().position(|&a| active[a].req == s.req).expect("decoding");
                    std::iter::once(anchor).chain(proposals[i].tokens[..ks[i]].iter().copied()).collect()
                }
            })
            .collect();
        let batch: Vec<(SeqId, &[u32], LogitRows)> = active
            .iter()
            .zip(&inputs)
            .map(|(s, t)| (s.tid, t.as_slice(), if s.anchor.is_some() { LogitRows::All } else { LogitRows::Last }))
            .collect();
        let results = target.forward_batch(&batch)?;

        let mut finished = Vec::new();
        for (a, f) in results.into_iter().enumerate() {
            let opts = &requests[active[a].req].opts;
            let s = &mut active[a];
            let stop = match s.anchor {
                None => {
                    let first = *f.ids.last().ok_or_else(|| Error::Request("no logits row".into()))?;
                    s.pending = f.captured;
                    s.anchor = Some(first);
                    if opts.max_tokens == 0 {
                        Some(StopReason::MaxTokens)
                    } else {
                        emit(crate::Emitted { token: first, logprob: None }, &mut s.tokens, opts, &mut no_op)
                    }
                }
                Some(_) => {
                    let i = decoding.iter().position(|&d| d == a).expect("decoding");
                    let (k, p, g) = (ks[i], lens[i], &f.ids);
                    let m = (0..k).take_while(|&j| proposals[i].tokens[j] == g[j]).count();
                    target.truncate(s.tid, p + m + 1)?;
                    s.pending = f.captured.prefix(m + 1, row);
                    s.anchor = Some(g[m]);
                    let mut stop = None;
                    for &t in &g[..=m] {
                        stop = emit(crate::Emitted { token: t, logprob: None }, &mut s.tokens, opts, &mut no_op);
                        if stop.is_some() {
                            break;
                        }
                    }
                    stop
                }
            };
            let stop = match stop {
                None if target.seq_len(s.tid)? >= target.max_len() => Some(StopReason::ContextFull),
                other => other,
            };
            if let Some(stop) = stop {
                finished.push(a);
                let tokens = std::mem::take(&mut s.tokens);
                out[s.req] = Some(BatchOutput { tokens, stop, rounds: (s.first_round, round) });
            }
        }
        for a in finished.into_iter().rev() {
            let s = active.remove(a);
            target.close(s.tid)?;
            draft.close(s.did)?;
        }
        round += 1;
    }
    out.into_iter()
        .enumerate()
        .map(|(i, o)| o.ok_or_else(|| Error::Request(format!("request {i} never finished"))))
        .collect()
}
