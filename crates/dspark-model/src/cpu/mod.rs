//! The CPU reference path: f32 math from any on-disk dtype, the definition the CUDA backend is
//! tested against.
//!
//! * [`qwen3`] — the Qwen3 target, with its [`kv_cache`] (prefill, decode, verify, rollback,
//!   capture of chosen layers' outputs).
//! * [`dspark`] — the DSpark draft's backbone and context cache; [`markov`] — its sequential
//!   heads (Markov bias variants, confidence head, prefix survival), shared with the GPU draft.
//! * [`tp`] — the tensor-parallel reference: the target split over N ranks (`crate::tp`).

pub mod dspark;
pub mod kv_cache;
pub mod markov;
pub mod qwen3;
pub mod tp;

use crate::backend::{Forward, LogitRows};
use crate::Result;

/// Tokens a CPU forward takes at a time: a longer one (a prompt) runs as consecutive forwards of
/// this many, so a batched round that carries a prompt chunk (`Scheduler::with_prefill_chunk`)
/// computes exactly what the prompt's solo forward does, and a long prompt shares the rounds with
/// the other requests' tokens instead of stalling them for its whole length (the demo prefills
/// ~1,450 tokens/s on 2 cores: a 1,500-token prompt held a batched round for 1.03 s unchunked).
pub const PREFILL_CHUNK: usize = 256;

/// `one` over `tokens` in chunks of [`PREFILL_CHUNK`], as one forward: every chunk's captured
/// rows, and the logits of the rows `rows` asks for (all chunks' rows, or the last row).
pub(crate) fn forward_chunked(
    tokens: &[u32],
    rows: LogitRows,
    mut one: impl FnMut(&[u32], LogitRows) -> Result<Forward>,
) -> Result<Forward> {
    if tokens.len() <= PREFILL_CHUNK {
        return one(tokens, rows);
    }
    let mut out = Forward { logits: Vec::new(), rows: 0, captured: Vec::new() };
    let mut chunks = tokens.chunks(PREFILL_CHUNK).peekable();
    while let Some(chunk) = chunks.next() {
        let last = chunks.peek().is_none();
        let f = one(chunk, rows)?;
        out.captured.extend_from_slice(&f.captured);
        if matches!(rows, LogitRows::All) || last {
            out.logits.extend_from_slice(&f.logits);
            out.rows += f.rows;
        }
    }
    Ok(out)
}
