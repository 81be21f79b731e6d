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

use crate::stats::{Generation, StopReason};
use dspark_model::{Error, LogitRows, Result, TargetModel};
use std::time::{Duration, Instant};

/// Limits of one generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate (the stop id counts as one).
    pub max_tokens: usize,
    /// Generation ends right after any of these ids is emitted.
    pub eos_token_ids: Vec<u32>,
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

/// Greedy decoding from an empty cache. `on_token` sees each id as soon as it is chosen.
pub fn greedy<T: TargetModel + ?Sized>(
    target: &mut T,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32),
) -> Result<Generation> {
    check_prompt(target, prompt)?;
    target.truncate(0)?;
    let start = Instant::now();
    let mut next = target.forward_greedy(prompt, LogitRows::Last)?.ids[0];
    let prefill = start.elapsed();
    let decode_start = Instant::now();
    let mut tokens = Vec::new();
    let stop = if opts.max_tokens == 0 {
        StopReason::MaxTokens
    } else {
        loop {
            tokens.push(next);
            on_token(next);
            if opts.eos_token_ids.contains(&next) {
                break StopReason::Eos;
            }
            if tokens.len() >= opts.max_tokens {
                break StopReason::MaxTokens;
            }
            if target.len() >= target.max_len() {
                break StopReason::ContextFull;
            }
            next = target.forward_greedy(&[next], LogitRows::Last)?.ids[0];
        }
    };
    let decode = if tokens.len() > 1 { decode_start.elapsed() } else { Duration::ZERO };
    Ok(Generation { tokens, stop, prompt_tokens: prompt.len(), prefill, decode, spec: None })
}
