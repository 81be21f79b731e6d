//! What a generation produced and how long it took.

use serde::Serialize;
use std::time::Duration;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model emitted one of the stop ids (the id is the last generated token).
    Eos,
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// The KV cache reached `max_position_embeddings`.
    ContextFull,
}

/// Result of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Generated ids, the stop id included when generation ended on one.
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub prompt_tokens: usize,
    /// Time of the prompt forward (prefill), which also yields the first generated token.
    pub prefill: Duration,
    /// Time from the first generated token to the last.
    pub decode: Duration,
}

impl Generation {
    /// Decode throughput: tokens after the first, over the decode time.
    pub fn decode_tokens_per_second(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1) as f64;
        let s = self.decode.as_secs_f64();
        if s > 0.0 {
            n / s
        } else {
            0.0
        }
    }
}
