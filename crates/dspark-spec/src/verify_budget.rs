//! The verify budget of a batched round: which draft positions of which requests one target
//! forward verifies (the DSpark paper's Algorithm 1, DSPARK.md §3.3; issue #30).
//!
//! Each request r proposes a block of drafts and, from the confidence head, the prefix survival
//! `a[r][j]`: the probability that its drafts 1..=j+1 are all accepted. Verifying `ℓ_r` drafts of
//! every request costs one forward over `B = Σ_r (1 + ℓ_r)` tokens (every request verifies at
//! least its anchor) and yields `τ = Σ_r (1 + Σ_{j<ℓ_r} a[r][j])` tokens in expectation. The budget
//! maximises the throughput `Θ = τ / t(B)`, `t` the measured seconds of a forward of B tokens
//! ([`CostTable`], SPS(B) = 1 / t(B) in the paper): it admits (request, position) pairs in
//! descending survival — ties to the lower request, then the lower position — and stops at the
//! first pair whose admission would not raise Θ. The early stop is what keeps sampled drafts
//! lossless (paper Appendix A): the pairs it never admits cannot steer the choice past the point
//! where it stopped.
//!
//! `a[r][j]` is a cumulative product of probabilities, so it does not increase along j, and the
//! descending order admits each request's positions as a prefix. The budget takes the running
//! minimum of each row, so a row that is not monotone (a caller's rounding) still yields
//! prefixes. With one request this is [`VerifyLen::Auto`](crate::VerifyLen)'s choice exactly (a
//! test checks it).
//!
//! Not yet driven by a loop: the batched round (many requests in one target forward) is the
//! part of issue #30 this waits for.

use crate::verify_len::CostTable;

/// Drafts to verify per request: `survival[r]` is request r's prefix survival (at least as long
/// as the drafts it may verify), `blocks[r]` the drafts it proposed, `costs.seconds[B - 1]` the
/// time of a forward of B tokens. A forward longer than the table is never chosen; if even the
/// anchors (B = number of requests) exceed it, every request verifies its anchor alone.
pub fn verify_budget(survival: &[&[f32]], blocks: &[usize], costs: &CostTable) -> Vec<usize> {
    assert_eq!(survival.len(), blocks.len(), "one survival row per request");
    let requests = survival.len();
    let mut chosen = vec![0usize; requests];
    if requests == 0 || requests > costs.seconds.len() {
        return chosen;
    }
    // Every (request, position) pair a request may verify, at its running-minimum survival.
    let mut pairs: Vec<(f32, usize, usize)> = Vec::new();
    for (r, (row, &block)) in survival.iter().zip(blocks).enumerate() {
        let mut a = f32::INFINITY;
        for (j, &s) in row.iter().take(block).enumerate() {
            a = a.min(if s.is_nan() { 0.0 } else { s });
            pairs.push((a, r, j));
        }
    }
    // Descending survival; ties to the lower request, then the lower position.
    pairs.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    // The forward with the anchors and every pair admitted so far holds `tokens` tokens.
    let mut expected = requests as f64;
    let mut best = expected / costs.seconds[requests - 1];
    for (tokens, (a, r, j)) in (requests..costs.seconds.len()).zip(pairs) {
        debug_assert_eq!(j, chosen[r], "the order admits prefixes");
        let rate = (expected + a as f64) / costs.seconds[tokens];
        if rate <= best {
            break;
        }
        expected += a as f64;
        best = rate;
        chosen[r] = j + 1;
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VerifyLen;
    use dspark_model::testing::Rng;

    fn table(f: impl Fn(usize) -> f64, len: usize) -> CostTable {
        CostTable { seconds: (1..=len).map(f).collect() }
    }

    /// A random non-increasing survival row of `n` values in [0, 1).
    fn survival_row(rng: &mut Rng, n: usize) -> Vec<f32> {
        let mut a = 1.0f32;
        (0..n)
            .map(|_| {
                a *= rng.f32().abs().fract();
                a
            })
            .collect()
    }

    /// One noisy entry in a measured table (a forward of 6 tokens timed slower than one of 8)
    /// stops the scan before the drafts worth verifying; the envelope the measurement applies
    /// (`CostTable::envelope`) lets it go on.
    #[test]
    fn a_bump_in_the_table_stops_the_budget_early_and_the_envelope_removes_it() {
        let a = [0.95f32, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65];
        let smooth = table(|n| 1.0 + 0.01 * n as f64, 16);
        let mut bumped = smooth.clone();
        bumped.seconds[5] = 1.5;
        let (want, got) = (verify_budget(&[&a], &[7], &smooth), verify_budget(&[&a], &[7], &bumped));
        assert_eq!(want, vec![7], "every draft pays at this slope");
        assert_eq!(got, vec![4], "the bump at 6 tokens (5 drafts) should stop the scan after 4");
        assert_eq!(verify_budget(&[&a], &[7], &bumped.envelope()), want);
    }

    #[test]
    fn one_request_is_the_auto_verify_length() {
        let mut rng = Rng(30);
        for case in 0..500 {
            let block = 1 + case % 7;
            let a = survival_row(&mut rng, 7);
            let slope = 0.002 + 0.2 * rng.f32().abs().fract() as f64;
            let costs = table(|n| 1.0 + slope * n as f64 + 0.01 * (n * n) as f64 * (case % 3) as f64, 8);
            let want = VerifyLen::Auto(costs.clone()).choose(Some(&a), block);
            assert_eq!(verify_budget(&[&a], &[block], &costs), vec![want], "case {case}: a {a:?}");
        }
    }

    #[test]
    fn flat_cost_admits_every_live_draft_and_the_table_bounds_the_batch() {
        let costs = table(|_| 1.0, 64);
        let (a, b) = ([0.9f32, 0.5, 0.0, 0.0], [0.7f32, 0.6, 0.4, 0.1]);
        assert_eq!(verify_budget(&[&a, &b], &[4, 3], &costs), vec![2, 3]);
        // A table of 5 tokens: two anchors and the three best drafts (0.9, 0.7, 0.6).
        let short = table(|_| 1.0, 5);
        assert_eq!(verify_budget(&[&a, &b], &[4, 4], &short), vec![1, 2]);
        // Fewer table entries than requests: anchors only.
        assert_eq!(verify_budget(&[&a, &b, &a], &[4, 4, 4], &table(|_| 1.0, 2)), vec![0, 0, 0]);
    }

    #[test]
    fn the_budget_goes_to_the_likeliest_drafts_and_stops_at_the_first_loss() {
        // Tokens cost 10% each beyond 4: a draft pays only while its survival beats the rate's fall.
        let costs = table(|n| if n <= 4 { 1.0 } else { 1.0 + 0.1 * (n - 4) as f64 }, 32);
        let hot = [0.95f32, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65];
        let cold = [0.2f32, 0.05, 0.01, 0.0, 0.0, 0.0, 0.0];
        // Θ: 3 anchors 3.0; hot's seven drafts 3.95, 4.41, 4.75, 5.0, 5.18, 5.3, 5.375; then
        // cold's 0.2 would give 8.8 / 1.7 = 5.18 < 5.375: stop.
        assert_eq!(verify_budget(&[&cold, &hot, &cold], &[7, 7, 7], &costs), vec![0, 7, 0]);
        // t(B) = 1 + 0.5 (B − 1): Θ 1, 1.33, 1.49, then the third draft (0.5) gives 1.39: stop.
        // The fourth draft's 0.99 counts as 0.5 (the running minimum) and is never reached.
        let steep = table(|n| 1.0 + 0.5 * (n - 1) as f64, 8);
        assert_eq!(verify_budget(&[&[0.99f32, 0.99, 0.5, 0.99]], &[4], &steep), vec![2]);
    }

    /// The best prefix lengths by exhaustive search (for small cases), ties to the shorter.
    fn brute_force(rows: &[&[f32]], block: usize, costs: &CostTable) -> Vec<usize> {
        let r = rows.len();
        let mut best = (f64::MIN, vec![0; r]);
        let mut l = vec![0usize; r];
        loop {
            let tokens: usize = l.iter().map(|x| 1 + x).sum();
            if tokens <= costs.seconds.len() {
                let tau: f64 =
                    l.iter().zip(rows).map(|(&n, a)| 1.0 + a[..n].iter().map(|&v| v as f64).sum::<f64>()).sum();
                let theta = tau / costs.seconds[tokens - 1];
                if theta > best.0 {
                    best = (theta, l.clone());
                }
            }
            let mut i = 0;
            while i < r {
                l[i] += 1;
                if l[i] <= block {
                    break;
                }
                l[i] = 0;
                i += 1;
            }
            if i == r {
                return best.1;
            }
        }
    }

    #[test]
    fn greedy_admission_matches_the_exhaustive_best_on_concave_gains() {
        // With non-increasing survival and a convex cost, the greedy order reaches the best Θ.
        let mut rng = Rng(31);
        for case in 0..200 {
            let rows: Vec<Vec<f32>> = (0..3).map(|_| survival_row(&mut rng, 4)).collect();
            let refs: Vec<&[f32]> = rows.iter().map(|v| v.as_slice()).collect();
            let c = 0.05 + 0.3 * rng.f32().abs().fract() as f64;
            let costs = table(|n| 1.0 + c * n as f64 + 0.01 * (n * n) as f64, 15);
            let got = verify_budget(&refs, &[4, 4, 4], &costs);
            let want = brute_force(&refs, 4, &costs);
            let theta = |l: &[usize]| {
                let tokens: usize = l.iter().map(|x| 1 + x).sum();
                let tau: f64 =
                    l.iter().zip(&refs).map(|(&n, a)| 1.0 + a[..n].iter().map(|&v| v as f64).sum::<f64>()).sum();
                tau / costs.seconds[tokens - 1]
            };
            assert!(theta(&got) >= theta(&want) * (1.0 - 1e-9), "case {case}: {got:?} vs best {want:?}");
        }
    }
}
