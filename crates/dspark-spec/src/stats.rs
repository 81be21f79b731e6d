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
    /// The token callback returned [`std::ops::ControlFlow::Break`] (the caller's own stop: a
    /// stop string matched, the client went away). The last token is the one it broke on;
    /// when that token also ended generation by itself (an eos id, `max_tokens`), that reason
    /// is reported instead.
    Stopped,
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
    /// Per-round statistics of speculative decoding (`None` for plain greedy).
    pub spec: Option<SpecStats>,
}

/// Per-round record of speculative decoding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpecStats {
    /// Drafts proposed per block (B).
    pub block_size: usize,
    /// Drafts verified in each round (k).
    pub verified: Vec<usize>,
    /// Drafts accepted in each round (m ≤ k).
    pub accepted: Vec<usize>,
}

impl SpecStats {
    pub fn new(block_size: usize) -> SpecStats {
        SpecStats { block_size, verified: Vec::new(), accepted: Vec::new() }
    }

    pub fn record(&mut self, verified: usize, accepted: usize) {
        self.verified.push(verified);
        self.accepted.push(accepted);
    }

    pub fn rounds(&self) -> usize {
        self.accepted.len()
    }

    /// Mean tokens committed per round, m + 1 (the paper's acceptance length τ, which counts
    /// the correction / bonus token).
    pub fn mean_accepted_length(&self) -> f64 {
        if self.accepted.is_empty() {
            return 0.0;
        }
        self.accepted.iter().map(|&m| (m + 1) as f64).sum::<f64>() / self.accepted.len() as f64
    }

    /// `histogram[m]` = rounds that accepted exactly m drafts, m = 0 ..= B.
    pub fn accepted_histogram(&self) -> Vec<usize> {
        let mut h = vec![0; self.block_size + 1];
        for &m in &self.accepted {
            h[m.min(self.block_size)] += 1;
        }
        h
    }
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
