//! Greedy DSpark speculative decoding (DSPARK.md §4), lossless.
//!
//! ```text
//! prefill: logits, F = target(prompt);  a = argmax(logits[-1]);  emit a;  pending = F
//!          (in chunks the target sets, each chunk's F appended to the draft as it comes)
//! round:   draft.append_captured(pending)           # positions the draft has not seen
//!          d_1..d_B = draft.propose(a)               # one parallel pass + Markov chain
//!          k = verify_len(survival)                  # how many drafts to check
//!          g_0..g_k, F' = target([a, d_1..d_k])      # one forward at positions p..p+k
//!                                                    # (on a GPU, d stays on the device)
//!          m = longest prefix with d_{i+1} == g_i
//!          emit d_1..d_m, g_m;  rollback target to p+m+1;  pending = F'[0..=m];  a = g_m
//! ```
//!
//! Every emitted token is the target's argmax given exactly the committed prefix, so the output
//! equals plain greedy decoding whatever the draft proposes — the draft only changes how many
//! tokens one target forward yields.
//!
//! With [`GenerateOptions::logprobs`] set the loop takes the host-logits path: the last prefill
//! chunk and every verify through [`TargetModel::forward`] (all rows' logits on the host, the
//! argmax taken there), the proposal read to the host before the verify; the tokens and the
//! round statistics are the same as on the device-argmax path.

use crate::logprobs::{emitted, Emitted};
use crate::sampled::emit;
use crate::stats::{Generation, SpecStats, StopReason};
use crate::verify_len::VerifyLen;
use crate::GenerateOptions;
use dspark_kernels::cpu::argmax::argmax;
use dspark_model::{Captured, Deferred, Drafter, LogitRows, Result, TargetModel};
use std::ops::ControlFlow;
use std::time::Instant;

/// The prompt through the target, in chunks of at most `target.prefill_chunk()` tokens, each
/// chunk's captured rows handed to the draft before the next chunk's forward overwrites them
/// (so a GPU prefill's captures never leave the device). Returns the target's next token and
/// the last chunk's captures, which the first round appends.
pub fn prefill<T: TargetModel + ?Sized, D: Drafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    prompt: &[u32],
) -> Result<(u32, Captured)> {
    let (e, captured) = prefill_logprobs(target, draft, prompt, None)?;
    Ok((e.token, captured))
}

/// [`prefill`], the next token's logprob reported when `logprobs` is set (the last chunk then
/// through [`TargetModel::forward`], its captures on the host).
fn prefill_logprobs<T: TargetModel + ?Sized, D: Drafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    prompt: &[u32],
    logprobs: Option<usize>,
) -> Result<(Emitted, Captured)> {
    let mut chunks = prompt.chunks(target.prefill_chunk().max(1)).peekable();
    loop {
        let chunk = chunks.next().ok_or_else(|| dspark_model::Error::Request("empty prompt".into()))?;
        let last = chunks.peek().is_none();
        if last && logprobs.is_some() {
            let f = target.forward(chunk, LogitRows::Last)?;
            let row = f.row(f.rows - 1, target.config().vocab_size);
            return Ok((emitted(argmax(row) as u32, Some(row), logprobs), Captured::Host(f.captured)));
        }
        let f = target.forward_greedy(chunk, LogitRows::Last)?;
        if last {
            let anchor = *f.ids.first().ok_or_else(|| dspark_model::Error::Request("no logits row".into()))?;
            return Ok((Emitted { token: anchor, logprob: None }, f.captured));
        }
        draft.append_captured(&f.captured)?;
    }
}

/// Speculative greedy decoding from empty caches. `on_token` sees each id as it is committed;
/// its `Break` ends generation after that id ([`StopReason::Stopped`]).
pub fn speculative<T: TargetModel + ?Sized, D: Drafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    prompt: &[u32],
    opts: &GenerateOptions,
    verify_len: &VerifyLen,
    mut on_token: impl FnMut(&Emitted) -> ControlFlow<()>,
) -> Result<Generation> {
    crate::greedy::check_prompt(target, prompt)?;
    let block = draft.block_size();
    // Floats per captured row on the host: T taps of the hidden size.
    let row = draft.target_layer_ids().len() * target.config().hidden_size;
    target.truncate(0)?;
    target.set_capture(draft.target_layer_ids())?;
    draft.reset();

    let start = Instant::now();
    let lp = opts.logprobs;
    let vocab = target.config().vocab_size;
    let (first, mut pending) = prefill_logprobs(target, draft, prompt, lp)?;
    let mut anchor = first.token;
    let prefill = start.elapsed();
    let decode_start = Instant::now();

    let mut tokens: Vec<u32> = Vec::new();
    let mut stats = SpecStats::new(block);

    let stop = 'gen: {
        if opts.max_tokens == 0 {
            break 'gen StopReason::MaxTokens;
        }
        if let Some(stop) = emit(first, &mut tokens, opts, &mut on_token) {
            break 'gen stop;
        }
        loop {
            let p = target.len();
            if p >= target.max_len() {
                break 'gen StopReason::ContextFull;
            }
            draft.append_captured(&pending)?;
            // A fixed verify length needs nothing from the proposal, so on a GPU the draft's
            // tokens go straight into the verify and the round synchronises with the host once,
            // for the verify's result; choosing the length from the confidence head reads the
            // proposal first, and so does the host-logits path.
            let deferred = match verify_len {
                VerifyLen::Fixed(_) if lp.is_none() => draft.propose_deferred(anchor)?,
                _ => Deferred::Ready(draft.propose(anchor)?),
            };
            let survival = match &deferred {
                Deferred::Ready(p) => p.survival.clone(),
                Deferred::OnDevice(_) => None,
            };
            // Never verify past the context, and never more drafts than tokens still wanted.
            let room = target.max_len() - p - 1;
            let wanted = opts.max_tokens - tokens.len() - 1;
            let k = verify_len.choose(survival.as_deref(), block).min(room).min(wanted);

            // g_i: the argmax of verify row i; `logits` holds the rows on the host-logits path.
            let (g, captured, logits) = if lp.is_none() {
                let f = target.verify_greedy(anchor, &deferred, k)?;
                (f.ids, f.captured, None)
            } else {
                let Deferred::Ready(prop) = &deferred else {
                    return Err(dspark_model::Error::Request("the host-logits path needs a host proposal".into()));
                };
                let mut input = Vec::with_capacity(k + 1);
                input.push(anchor);
                input.extend_from_slice(&prop.tokens[..k]);
                let f = target.forward(&input, LogitRows::All)?;
                let g = (0..f.rows).map(|r| argmax(f.row(r, vocab)) as u32).collect::<Vec<_>>();
                (g, Captured::Host(f.captured), Some(f.logits))
            };
            let proposal = draft.finish_proposal(deferred)?;
            let m = (0..k).take_while(|&i| proposal.tokens[i] == g[i]).count();
            stats.record(k, m);

            target.truncate(p + m + 1)?;
            pending = captured.prefix(m + 1, row);
            for (i, &t) in g[..=m].iter().enumerate() {
                // g_i == d_{i+1} for i < m, so the accepted drafts and the correction are g_0..g_m.
                let z = logits.as_ref().map(|l| &l[i * vocab..(i + 1) * vocab]);
                if let Some(stop) = emit(emitted(t, z, lp), &mut tokens, opts, &mut on_token) {
                    break 'gen stop;
                }
            }
            anchor = g[m];
        }
    };
    let decode = decode_start.elapsed();
    Ok(Generation { tokens, stop, prompt_tokens: prompt.len(), prefill, decode, spec: Some(stats) })
}
