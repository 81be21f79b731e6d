//! How many draft tokens to verify each round (`--verify-len N|auto`).
//!
//! Verifying k drafts costs one target forward over k + 1 tokens, `t(k+1)`, and yields
//! `E(k) = 1 + Σ_{s<k} a_s` tokens in expectation, where `a_s` is the confidence head's
//! prefix survival (the probability that drafts 1..=s+1 are all accepted). `auto` picks the k
//! with the best rate `E(k) / t(k+1)`, scanning k = 0, 1, … left to right and stopping at the
//! first k whose rate is lower than the previous one. `a_s` for slot s depends only on the
//! drafts before it, so the choice never looks at draft tokens beyond the ones it admits
//! (DSPARK.md §3.3); under greedy decoding the output is the same for every k anyway.
//!
//! `t(n)` comes from a cost table measured on the active backend at start-up
//! ([`CostTable::measure`]). Without a confidence head `auto` verifies the whole block.

use dspark_model::{LogitRows, Result, TargetModel};
use std::time::Instant;

/// Seconds per target forward of `n` tokens, for n = 1 ..= len.
#[derive(Clone, Debug, PartialEq)]
pub struct CostTable {
    /// `seconds[n - 1]` is the time of a forward over n tokens.
    pub seconds: Vec<f64>,
}

impl CostTable {
    /// Times forwards of 1 ..= `max_tokens` tokens on `target` after a short warm-up context,
    /// taking the best of `reps` runs each, then restores the cache to empty.
    pub fn measure<T: TargetModel + ?Sized>(target: &mut T, max_tokens: usize, reps: usize) -> Result<CostTable> {
        target.truncate(0)?;
        let ctx = 16.min(target.max_len().saturating_sub(max_tokens + 1)).max(1);
        let filler: Vec<u32> = (0..ctx as u32).map(|i| i % target.config().vocab_size as u32).collect();
        target.forward_greedy(&filler, LogitRows::Last)?;
        let mut seconds = Vec::with_capacity(max_tokens);
        for n in 1..=max_tokens {
            let tokens = vec![0u32; n];
            let mut best = f64::INFINITY;
            for _ in 0..reps.max(1) {
                let t0 = Instant::now();
                target.forward_greedy(&tokens, LogitRows::All)?;
                best = best.min(t0.elapsed().as_secs_f64());
                target.truncate(ctx)?;
            }
            seconds.push(best);
        }
        target.truncate(0)?;
        Ok(CostTable { seconds }.envelope())
    }

    /// The table with each entry lowered to the least time of any forward at least as long: a
    /// forward over fewer tokens does the same work over fewer rows, so a time above a longer
    /// forward's is noise of the measurement (a clock step, a stray launch). Left in, such a
    /// bump ends the verify choices' scans early — the first pair whose admission does not raise
    /// the rate stops them — and a round verifies fewer drafts than it should. The result never
    /// decreases along n, and a table that already did not is unchanged.
    pub fn envelope(mut self) -> CostTable {
        for n in (1..self.seconds.len()).rev() {
            self.seconds[n - 1] = self.seconds[n - 1].min(self.seconds[n]);
        }
        self
    }
}

/// The verify-length policy.
#[derive(Clone, Debug, PartialEq)]
pub enum VerifyLen {
    /// Verify `min(N, B)` drafts every round.
    Fixed(usize),
    /// Maximise expected tokens per second from the confidence head and a cost table.
    Auto(CostTable),
}

impl VerifyLen {
    /// Number of drafts to verify for a block of `block` drafts with optional prefix survival.
    pub fn choose(&self, survival: Option<&[f32]>, block: usize) -> usize {
        match (self, survival) {
            (VerifyLen::Fixed(n), _) => (*n).min(block),
            (VerifyLen::Auto(_), None) => block,
            (VerifyLen::Auto(costs), Some(a)) => {
                let mut best = 0;
                let mut expected = 1.0f64;
                let mut best_rate = expected / costs.seconds[0];
                for k in 1..=block.min(a.len()).min(costs.seconds.len() - 1) {
                    expected += a[k - 1] as f64;
                    let rate = expected / costs.seconds[k];
                    if rate <= best_rate {
                        break;
                    }
                    best = k;
                    best_rate = rate;
                }
                best
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_lowers_bumps_and_keeps_a_monotone_table() {
        let t = |v: &[f64]| CostTable { seconds: v.to_vec() };
        assert_eq!(t(&[1.0, 1.1, 1.2]).envelope(), t(&[1.0, 1.1, 1.2]));
        assert_eq!(t(&[1.0, 1.5, 1.2, 1.3]).envelope(), t(&[1.0, 1.2, 1.2, 1.3]));
        assert_eq!(t(&[2.0, 1.0, 3.0]).envelope(), t(&[1.0, 1.0, 3.0]));
        assert_eq!(t(&[]).envelope(), t(&[]));
        let mut rng = dspark_model::testing::Rng(61);
        for _ in 0..200 {
            let raw: Vec<f64> = (0..1 + rng.below(40)).map(|_| 1.0 + rng.f32().abs() as f64).collect();
            let e = t(&raw).envelope().seconds;
            assert!(e.windows(2).all(|w| w[0] <= w[1]), "not monotone: {e:?}");
            assert!(e.iter().zip(&raw).all(|(a, b)| a <= b), "raised an entry: {raw:?} → {e:?}");
            // Each entry is the least of the raw times from it on.
            for (n, v) in e.iter().enumerate() {
                assert_eq!(*v, raw[n..].iter().copied().fold(f64::INFINITY, f64::min));
            }
        }
    }

    #[test]
    fn auto_stops_where_the_rate_falls() {
        // Flat cost: verifying more never costs more, so every draft with survival > 0 helps.
        let flat = VerifyLen::Auto(CostTable { seconds: vec![1.0; 8] });
        assert_eq!(flat.choose(Some(&[0.9, 0.5, 0.1, 0.0, 0.0, 0.0, 0.0]), 7), 3);
        // Each extra verified token costs 5%: a draft is worth it only while E(k)/t(k+1) rises.
        // Rates: k=0 1.0, k=1 1.99/1.05, k=2 2.97/1.1, k=3 3.94/1.15, k=4 3.99/1.2 (falls).
        let gentle = VerifyLen::Auto(CostTable { seconds: (0..8).map(|n| 1.0 + 0.05 * n as f64).collect() });
        assert_eq!(gentle.choose(Some(&[0.99, 0.98, 0.97, 0.05, 0.04, 0.0, 0.0]), 7), 3);
        assert_eq!(gentle.choose(Some(&[0.03, 0.02, 0.01, 0.0, 0.0, 0.0, 0.0]), 7), 0);
        assert_eq!(flat.choose(None, 7), 7);
        assert_eq!(VerifyLen::Fixed(3).choose(None, 7), 3);
        assert_eq!(VerifyLen::Fixed(9).choose(None, 7), 7);
    }
}
