//! What the loops hand their token callback: the emitted id and, when asked for
//! ([`crate::GenerateOptions::logprobs`]), its log-probability and the row's most likely ids.
//!
//! ```text
//! logprob(t) = z_t − log Σ_j exp(z_j)       z = the target's raw logits row that produced t
//! ```
//!
//! "Raw" as vLLM's default (`logprobs_mode = raw_logprobs`): the row before temperature,
//! top-k/top-p/min-p, so the numbers describe the model, not the request's sampler. Every
//! emitted token has such a row: plain decoding's last row; in a speculative round an accepted
//! draft `d_{i+1}` comes from verify row `i` and the correction, residual or bonus from row `m`;
//! the first token from the prefill's last row. Computed in f64.

/// The log-probability of one emitted token under its row, and the row's `n` most likely ids.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// log_softmax(row)[token].
    pub logprob: f64,
    /// The `n` ids with the largest logprob, largest first (ties: lower id first), with theirs.
    pub top: Vec<(u32, f64)>,
}

/// One emitted token as the loops report it to their callback.
#[derive(Clone, Debug, PartialEq)]
pub struct Emitted {
    pub token: u32,
    /// `Some` exactly when [`crate::GenerateOptions::logprobs`] is set.
    pub logprob: Option<TokenLogprob>,
}

/// log_softmax of `row` at `token`, and its `top` most likely ids (f64; NaN logits count as −∞).
pub fn token_logprob(row: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = row.iter().copied().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().filter(|x| !x.is_nan()).map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    let lp = |z: f32| if z.is_nan() { f64::NEG_INFINITY } else { z as f64 - lse };
    // The `top` largest, kept sorted descending; a later id joins only when strictly larger than
    // the last kept, and goes after equal ones, so ties keep the lower id first.
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &z) in row.iter().enumerate() {
            let z = if z.is_nan() { f32::NEG_INFINITY } else { z };
            if best.len() == top && z <= best[top - 1].1 {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= z);
            best.insert(at, (i as u32, z));
            best.truncate(top);
        }
    }
    TokenLogprob {
        logprob: row.get(token as usize).map_or(f64::NEG_INFINITY, |&z| lp(z)),
        top: best.into_iter().map(|(i, z)| (i, lp(z))).collect(),
    }
}

/// [`Emitted`] for `token` from `row`, with its logprob when `logprobs` is `Some(top)`.
pub(crate) fn emitted(token: u32, row: Option<&[f32]>, logprobs: Option<usize>) -> Emitted {
    Emitted { token, logprob: logprobs.zip(row).map(|(n, r)| token_logprob(r, token, n)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_top_with_ties_to_the_lower_id() {
        let row = [1.0f32, 3.0, 3.0, -2.0, 0.5];
        let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        let t = token_logprob(&row, 4, 3);
        assert!((t.logprob - (0.5 - lse)).abs() < 1e-12);
        let ids: Vec<u32> = t.top.iter().map(|p| p.0).collect();
        assert_eq!(ids, vec![1, 2, 0]);
        assert!((t.top[0].1 - (3.0 - lse)).abs() < 1e-12);
        assert!(token_logprob(&row, 1, 0).top.is_empty());
        assert_eq!(token_logprob(&row, 0, 10).top.len(), 5);
        let probs: f64 = row.iter().enumerate().map(|(i, _)| token_logprob(&row, i as u32, 0).logprob.exp()).sum();
        assert!((probs - 1.0).abs() < 1e-12);
    }
}
