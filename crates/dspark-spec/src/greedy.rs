//! Plain greedy decoding: prefill the prompt, then one target forward per token, each time
//! taking the argmax of the last row's logits.
//!
//! ```text
//! logits = target(prompt);  t = argmax(logits[-1])
//! repeat: emit t; stop on eos / max_tokens / full context; logits = target([t]); t = argmax
//! ```
//!
//! The emitted token is always the target's argmax given the exact committed prefix, which
//! is the definition of output the speculative loop is held to.

use crate::logprobs::{emitted, Emitted};
use crate::sampled::emit;
use crate::stats::{Generation, StopReason};
use dspark_kernels::cpu::argmax::argmax;
use dspark_model::{Error, LogitRows, Result, TargetModel};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// Limits of one generation, and what the callback is told.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// Most tokens to generate (the stop id counts as one).
    pub max_tokens: usize,
    /// Generation ends right after any of these ids is emitted.
    pub eos_token_ids: Vec<u32>,
    /// `Some(n)`: every [`Emitted`] carries its token's logprob and the row's `n` most likely
    /// ids (`n = 0`: the token's alone); see [`crate::logprobs`].
    ///
    /// The greedy loops then take the host-logits path, [`TargetModel::forward`] with the host
    /// argmax, instead of [`TargetModel::forward_greedy`] / [`TargetModel::verify_greedy`]: a
    /// CUDA target's device argmax never brings the logits to the host, and its draft tokens
    /// stay on the device. The tokens are the same either way (the argmax of the same row,
    /// lowest index on ties); only the speed differs (every row's logits are copied out).
    pub logprobs: Option<usize>,
}

/// Checks a prompt against the target before any work is done.
pub fn check_prompt<T: TargetModel + ?Sized>(target: &T, prompt: &[u32]) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::Request("the prompt is empty".into()));
    }
    if prompt.len() > target.max_len() {
        return Err(Error::Request(format!(
            "prompt of {} tokens is longer than max_position_embeddings = {}",
            prompt.len(),
            target.max_len()
        )));
    }
    Ok(())
}

/// The greedy token after `tokens` (the last row's argmax), with its logprob when asked.
fn step<T: TargetModel + ?Sized>(target: &mut T, tokens: &[u32], opts: &GenerateOptions) -> Result<Emitted> {
    if opts.logprobs.is_none() {
        let t = target.forward_greedy(tokens, LogitRows::Last)?.ids[0];
        return Ok(Emitted { token: t, logprob: None });
    }
    let f = target.forward(tokens, LogitRows::Last)?;
    let row = f.row(f.rows - 1, target.config().vocab_size);
    Ok(emitted(argmax(row) as u32, Some(row), opts.logprobs))
}

/// Greedy decoding from an empty cache. `on_token` sees each id as soon as it is chosen; its
/// `Break` ends generation after that id ([`StopReason::Stopped`]).
pub fn greedy<T: TargetModel + ?Sized>(
    target: &mut T,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(&Emitted) -> ControlFlow<()>,
) -> Result<Generation> {
    check_prompt(target, prompt)?;
    target.truncate(0)?;
    let start = Instant::now();
    let mut next = step(target, prompt, opts)?;
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
            next = step(target, &[*tokens.last().expect("a token was emitted")], opts)?;
        }
    };
    let decode = if tokens.len() > 1 { decode_start.elapsed() } else { Duration::ZERO };
    Ok(Generation { tokens, stop, prompt_tokens: prompt.len(), prefill, decode, spec: None })
}
