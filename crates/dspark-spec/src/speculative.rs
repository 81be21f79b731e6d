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

use crate::sampled::emit;
use crate::stats::{Generation, SpecStats, StopReason};
use crate::verify_len::VerifyLen;
use crate::GenerateOptions;
use dspark_model::{Captured, Deferred, Drafter, LogitRows, Result, TargetModel};
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
    let mut chunks = prompt.chunks(target.prefill_chunk().max(1)).peekable();
    loop {
        let chunk = chunks.next().ok_or_else(|| dspark_model::Error::Request("empty prompt".into()))?;
        let f = target.forward_greedy(chunk, LogitRows::Last)?;
        if chunks.peek().is_none() {
            let anchor = *f.ids.first().ok_or_else(|| dspark_model::Error::Request("no logits row".into()))?;
            return Ok((anchor, f.captured));
        }
        draft.append_captured(&f.captured)?;
    }
}

/// Speculative greedy decoding from empty caches. `on_token` sees each id as it is committed.
pub fn speculative<T: TargetModel + ?Sized, D: Drafter + ?Sized>(
    target: &mut T,
    draft: &mut D,
    prompt: &[u32],
    opts: &GenerateOptions,
    verify_len: &VerifyLen,
    mut on_token: impl FnMut(u32),
) -> Result<Generation> {
    crate::greedy::check_prompt(target, prompt)?;
    let block = draft.block_size();
    // Floats per captured row on the host: T taps of the hidden size.
    let row = draft.target_layer_ids().len() * target.config().hidden_size;
    target.truncate(0)?;
    target.set_capture(draft.target_layer_ids())?;
    draft.reset();

    let start = Instant::now();
    let (mut anchor, mut pending) = prefill(target, draft, prompt)?;
    let prefill = start.elapsed();
    let decode_start = Instant::now();

    let mut tokens: Vec<u32> = Vec::new();
    let mut stats = SpecStats::new(block);

    let stop = 'gen: {
        if opts.max_tokens == 0 {
            break 'gen StopReason::MaxTokens;
        }
        if let Some(stop) = emit(anchor, &mut tokens, opts, &mut on_token) {
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
            // proposal first.
            let deferred = match verify_len {
                VerifyLen::Fixed(_) => draft.propose_deferred(anchor)?,
                VerifyLen::Auto(_) => Deferred::Ready(draft.propose(anchor)?),
            };
            let survival = match &deferred {
                Deferred::Ready(p) => p.survival.clone(),
                Deferred::OnDevice(_) => None,
            };
            // Never verify past the context, and never more drafts than tokens still wanted.
            let room = target.max_len() - p - 1;
            let wanted = opts.max_tokens - tokens.len() - 1;
            let k = verify_len.choose(survival.as_deref(), block).min(room).min(wanted);

            let f = target.verify_greedy(anchor, &deferred, k)?;
            let proposal = draft.finish_proposal(deferred)?;
            let g = f.ids;
            let m = (0..k).take_while(|&i| proposal.tokens[i] == g[i]).count();
            stats.record(k, m);

            target.truncate(p + m + 1)?;
            pending = f.captured.prefix(m + 1, row);
            for &t in g[..=m].iter() {
                // g_i == d_{i+1} for i < m, so the accepted drafts and the correction are g_0..g_m.
                if let Some(stop) = emit(t, &mut tokens, opts, &mut on_token) {
                    break 'gen stop;
                }
            }
            anchor = g[m];
        }
    };
    let decode = decode_start.elapsed();
    Ok(Generation { tokens, stop, prompt_tokens: prompt.len(), prefill, decode, spec: Some(stats) })
}
