//! [`batched`]: runs a list of requests with arrival rounds through a [`Scheduler`] to their
//! ends — the driver the property tests and the GPU tier use.

use super::{BatchOutput, BatchVerify, Scheduler};
use crate::greedy::GenerateOptions;
use crate::sampled::DraftLaw;
use crate::sampler::SamplingParams;
use dspark_model::{BatchDrafter, BatchTarget, Error, Result};
use std::ops::ControlFlow;

/// One request of a batched run: its prompt, its options (logprobs included), its
/// sampler (greedy at temperature 0), and the round at which it arrives.
#[derive(Clone, Debug)]
pub struct BatchRequest {
    pub prompt: Vec<u32>,
    pub opts: GenerateOptions,
    pub params: SamplingParams,
    pub arrival: usize,
}

/// The limits and the draft law of a batched run (see [`Scheduler`]'s builders).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Requests running at once.
    pub max_batch: usize,
    /// KV positions they may hold together ([`Scheduler::with_kv_capacity`]).
    pub kv_capacity: Option<usize>,
    /// Prompt tokens a request puts through one round ([`Scheduler::with_prefill_chunk`]).
    pub prefill_chunk: Option<usize>,
    /// Sampled requests' draft law ([`Scheduler::with_draft_law`]).
    pub law: DraftLaw,
}

/// Runs every request to its end within `limits`: request i is submitted at the round
/// `requests[i].arrival` (rounds with nothing to run are skipped), outputs in request order.
pub fn batched<T: BatchTarget + ?Sized, D: BatchDrafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    requests: &[BatchRequest],
    verify: &BatchVerify,
    limits: BatchLimits,
) -> Result<Vec<BatchOutput>> {
    let mut sched = Scheduler::new(verify.clone(), limits.max_batch)?.with_draft_law(limits.law);
    if let Some(cap) = limits.kv_capacity {
        sched = sched.with_kv_capacity(cap);
    }
    if let Some(chunk) = limits.prefill_chunk {
        sched = sched.with_prefill_chunk(chunk);
    }
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| (requests[i].arrival, i));
    let mut arrivals = order.into_iter().peekable();
    let mut index = Vec::with_capacity(requests.len()); // scheduler id → request index
    let mut out: Vec<Option<BatchOutput>> = vec![None; requests.len()];
    // Rounds the scheduler skipped while idle, so reported rounds count from round 0 of the run.
    let mut skipped = 0usize;
    loop {
        let now = sched.round() + skipped;
        if sched.is_idle() {
            match arrivals.peek() {
                Some(&i) if requests[i].arrival > now => skipped += requests[i].arrival - now,
                Some(_) => {}
                None => break,
            }
        }
        let now = sched.round() + skipped;
        while let Some(i) = arrivals.next_if(|&i| requests[i].arrival <= now) {
            let r = &requests[i];
            let id = sched
                .submit_sampled(target, r.prompt.clone(), r.opts.clone(), r.params)
                .map_err(|e| Error::Request(format!("request {i}: {e}")))?;
            debug_assert_eq!(id, index.len());
            index.push(i);
        }
        for f in sched.step(target, draft, |_, _| ControlFlow::Continue(()))? {
            let (a, b) = f.output.rounds;
            out[index[f.id]] = Some(BatchOutput { rounds: (a + skipped, b + skipped), ..f.output });
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, o)| o.ok_or_else(|| Error::Request(format!("request {i} never finished"))))
        .collect()
}
