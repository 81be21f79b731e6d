//! The engine's batched loop (`dspark serve --max-batch R`, issue #30).
//!
//! Up to R choices run at once in `dspark_spec::Scheduler` rounds, greedy or sampled (under
//! the engine's draft law, as alone): each round the draft proposes for every running choice and one target forward verifies all their rows, so every
//! stream advances every round instead of waiting for the requests queued before it. The loop:
//!
//! ```text
//! while a slot is free: take a job from the FIFO (block for one when nothing runs) and submit
//!     its first choice to the scheduler (seed + i for choice i)
//! cancel the choices whose client went away (running or waiting for pages)
//! one scheduler round; each token → its choice's text state (stop strings, client gone → stop
//!     that choice); each finished choice → its Done, and the job's next choice is submitted
//! ```
//!
//! How many drafts a greedy request verifies is the paper's Algorithm 1 (`verify_budget`) over
//! a cost table measured when the engine starts (a sampled one verifies the block, which keeps
//! its seed's tokens independent of the others): forwards of 1 ..= 64 tokens timed on a sequence
//! (a batched step holds 64 rows; more rows are more steps, so beyond 64 the table adds whole
//! steps), and every request's confidence-head survival. A draft without a confidence head
//! verifies full blocks. Prompts go through the rounds in the target's own prefill chunks, so a
//! long prompt shares rounds with the others' tokens and is prefilled as it would be alone.
//!
//! Jobs stay in the bounded FIFO until a slot frees, so a full server still answers 429. A
//! job's choices run one after another (its events stay in choice order, as the solo engine's).
//! Each choice's tokens are its solo run's — greedy, or sampled with its seed at the block's
//! verify length, as the one-at-a-time server runs it (`dspark-spec/tests/batched.rs`), logprobs
//! included (from the rows' logits, which come to the host for such a request), which the server
//! tests check over HTTP, bit for bit (both backends' small products are batch-invariant).

use crate::engine::{finish_choice, Engine, Event, Finish, Job, Models, TextState};
use crate::metrics::Metrics;
use dspark_model::BatchTarget;
use dspark_spec::{BatchVerify, CostTable, GenerateOptions, SamplingParams, Scheduler};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

/// A choice in the scheduler.
struct Running {
    job: Job,
    index: usize,
    st: TextState,
    /// When its first token came.
    first: Option<Instant>,
}

/// Serves the queue with batched rounds (see the module docs).
pub(crate) fn serve(mut engine: Engine, rx: Receiver<Job>, metrics: &Metrics) {
    let Models::Batched { target, draft, max_batch } = &mut engine.models else { return };
    let max_batch = *max_batch;
    let rows = max_batch * (draft.block_size() + 1);
    let verify = match cost_table(target.as_mut(), rows) {
        Ok(costs) => BatchVerify::Budget(costs),
        Err(e) => return eprintln!("dspark serve: measuring the verify cost table: {e}"),
    };
    let chunk = target.prefill_chunk();
    let law = engine.law;
    let new_scheduler = || {
        let s = Scheduler::new(verify.clone(), max_batch).map_err(|e| e.to_string())?.with_draft_law(law);
        Ok::<_, String>(if chunk < usize::MAX { s.with_prefill_chunk(chunk) } else { s })
    };
    let mut sched = match new_scheduler() {
        Ok(s) => s,
        Err(e) => return eprintln!("dspark serve: {e}"),
    };
    let capacity = target.kv_budget().map_or(0, |b| b.pages * b.page);
    metrics.kv_capacity.set(capacity as i64);
    let mut running: HashMap<usize, Running> = HashMap::new();
    let mut open = true;
    while open || !running.is_empty() {
        while open && running.len() < max_batch {
            let job = if running.is_empty() {
                match rx.recv() {
                    Ok(job) => job,
                    Err(_) => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            metrics.queue_depth.dec();
            if job.tx.is_closed() {
                continue;
            }
            submit_choice(&mut engine, &mut sched, &mut running, job, 0);
        }
        if running.is_empty() {
            continue;
        }
        let Models::Batched { target, draft, .. } = &mut engine.models else { return };
        // Choices whose client went away — running, or still waiting for pages — are cancelled
        // before the round: their sequences and reserved pages free now, not at a next token
        // that a waiting choice would first have to be admitted and prefilled to produce.
        let gone: Vec<usize> = running.iter().filter(|(_, r)| r.job.tx.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            running.remove(&id);
            match sched.cancel(target.as_mut(), draft.as_mut(), id) {
                Ok(tokens) => metrics.generated_tokens.inc_by(tokens.map_or(0, |t| t.len()) as u64),
                Err(e) => eprintln!("dspark serve: cancelling a request whose client left: {e}"),
            }
        }
        if running.is_empty() {
            continue;
        }
        let stepped = sched.step(target.as_mut(), draft.as_mut(), |id, e| {
            let going = running.get_mut(&id).is_some_and(|r| {
                r.first.get_or_insert_with(Instant::now);
                r.st.advance(Some(e), false)
            });
            if going {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        });
        // After the round: what its finished requests held is free again.
        metrics.running.set(sched.running() as i64);
        metrics.waiting.set(sched.waiting() as i64);
        metrics.kv_reserved.set(sched.kv_reserved() as i64);
        match stepped {
            Ok(finished) => {
                for f in finished {
                    let Some(mut r) = running.remove(&f.id) else { continue };
                    let s = f.output.spec;
                    let spec = Some((s.rounds(), s.mean_accepted_length()));
                    // Tokens after the first over the time since the first, as a solo generation
                    // counts its decode.
                    let tps =
                        r.first.map(|t| f.output.tokens.len().saturating_sub(1) as f64 / t.elapsed().as_secs_f64());
                    let result = Ok(Finish { stop: f.output.stop, spec, tokens_per_second: tps, stats: Some(s) });
                    let more = finish_choice(&mut r.st, result, r.job.req.prompt.len(), metrics);
                    if more && r.index + 1 < r.job.req.n {
                        submit_choice(&mut engine, &mut sched, &mut running, r.job, r.index + 1);
                    }
                }
            }
            Err(e) => {
                // A failed round fails every choice in it; their sequences are freed and the
                // scheduler starts afresh for the jobs still queued.
                let msg = format!("batched round failed: {e}");
                eprintln!("dspark serve: {msg}");
                for (id, r) in running.drain() {
                    let _ = r.st.tx_send(Event::Error(msg.clone()));
                    let _ = sched.cancel(target.as_mut(), draft.as_mut(), id);
                }
                match new_scheduler() {
                    Ok(s) => sched = s,
                    Err(e) => return eprintln!("dspark serve: {e}"),
                }
            }
        }
    }
}

/// Submits choice `index` of `job` to the scheduler (an error goes to the client).
fn submit_choice(
    engine: &mut Engine,
    sched: &mut Scheduler,
    running: &mut HashMap<usize, Running>,
    job: Job,
    index: usize,
) {
    let st = TextState::new(engine, &job, index);
    let opts = GenerateOptions {
        max_tokens: job.req.max_tokens,
        eos_token_ids: engine.eos_token_ids.clone(),
        logprobs: job.req.logprobs,
    };
    let Models::Batched { target, .. } = &engine.models else { return };
    let params = SamplingParams { seed: job.req.params.seed.wrapping_add(index as u64), ..job.req.params };
    match sched.submit_sampled(target.as_ref(), job.req.prompt.clone(), opts, params) {
        Ok(id) => {
            running.insert(id, Running { job, index, st, first: None });
        }
        Err(e) => {
            let _ = job.tx.send(Event::Error(e.to_string()));
        }
    }
}

/// Rows of one batched step (`CudaBatch`; the CPU's sequences run item by item, which the same
/// table only approximates).
const STEP_ROWS: usize = 64;

/// Seconds of a batched forward of 1 ..= `rows` tokens: forwards of up to [`STEP_ROWS`] timed on
/// a fresh sequence (best of 3), whole steps added beyond.
fn cost_table(target: &mut dyn BatchTarget, rows: usize) -> dspark_model::Result<CostTable> {
    let id = target.open()?;
    let mut measured = None;
    let ran = target.with_target(id, &mut |t| {
        measured = Some(CostTable::measure(t, rows.min(STEP_ROWS), 3)?);
        Ok(())
    });
    target.close(id)?;
    ran?;
    let one = measured.map(|c| c.seconds).unwrap_or_default();
    let Some(&full) = one.last() else { return Ok(CostTable { seconds: Vec::new() }) };
    let seconds = (1..=rows)
        .map(|b| {
            let (steps, rest) = (b / STEP_ROWS, b % STEP_ROWS);
            steps as f64 * full + if rest > 0 { one[rest - 1] } else { 0.0 }
        })
        .collect();
    Ok(CostTable { seconds })
}
