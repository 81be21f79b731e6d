//! The start-up check of a draft's acceptance.
//!
//! A draft that does not match its target — trained for other weights, reading the hidden
//! states of a quantized target that moved them, tapping the wrong layers — does not make
//! speculative output wrong (the verify keeps it exact); it makes it slow, and silently: the
//! known failure of other engines is a draft accepting ~0 tokens with no error (vLLM PR #49133,
//! SGLang #35629, vLLM #9534). A DSpark draft on the target it was trained for commits 3–6
//! tokens a round on chat (the paper's acceptance table), the demo coder 1.8–2.1 at temperature
//! 0.7–1 and more greedy; a mismatched one commits ~1. So the loops' callers feed the first
//! [`CHECK_ROUNDS`] full-block rounds of a process (its first generations, on the CLI or in the
//! server)
//! to an [`AcceptanceCheck`], which judges them once and reports a mean accepted length below
//! [`LOW_ACCEPTED_LENGTH`] as a [`LowAcceptance`] to print loudly.

use crate::stats::SpecStats;
use std::fmt;

/// Rounds the check waits for before it judges (fewer say nothing).
pub const CHECK_ROUNDS: usize = 16;
/// Mean tokens committed a round (τ, the bonus token included) below which the check warns.
pub const LOW_ACCEPTED_LENGTH: f64 = 1.3;

/// The first rounds seen so far, and whether they have been judged.
#[derive(Clone, Debug, Default)]
pub struct AcceptanceCheck {
    rounds: usize,
    committed: usize,
    judged: bool,
}

/// The verdict on a draft whose first rounds committed too little.
#[derive(Clone, Debug, PartialEq)]
pub struct LowAcceptance {
    pub rounds: usize,
    pub mean_accepted_length: f64,
}

impl AcceptanceCheck {
    pub fn new() -> AcceptanceCheck {
        AcceptanceCheck::default()
    }

    /// Takes one generation's rounds (only up to the first [`CHECK_ROUNDS`] of all seen), and
    /// once that many are in, judges them: `Some` exactly once, when they committed less than
    /// [`LOW_ACCEPTED_LENGTH`] tokens a round on average.
    pub fn observe(&mut self, stats: &SpecStats) -> Option<LowAcceptance> {
        if self.judged {
            return None;
        }
        // Only rounds that verified the whole block say what the draft is worth: a verify length
        // chosen short (the batched budget, `--verify-len auto`, the last tokens wanted) commits
        // few tokens whatever the draft.
        let full = stats.verified.iter().zip(&stats.accepted).filter(|(&k, _)| k == stats.block_size);
        for (_, &m) in full.take(CHECK_ROUNDS - self.rounds) {
            self.rounds += 1;
            self.committed += m + 1;
        }
        if self.rounds < CHECK_ROUNDS {
            return None;
        }
        self.judged = true;
        let mean = self.committed as f64 / self.rounds as f64;
        (mean < LOW_ACCEPTED_LENGTH).then_some(LowAcceptance { rounds: self.rounds, mean_accepted_length: mean })
    }

    /// Whether the first rounds have been judged (further generations change nothing).
    pub fn judged(&self) -> bool {
        self.judged
    }
}

impl fmt::Display for LowAcceptance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the draft's first {} rounds committed {:.2} tokens a round (accepting almost none of its \
             drafts), far below the 2-6 of a DSpark draft on the target it was trained for: the \
             output stays exact, but speculative decoding gains nothing. Check that the draft \
             belongs to this target (the same weights: a quantized target's hidden states differ \
             from the ones it was trained on) and its target_layer_ids; a very high temperature \
             also lowers acceptance",
            self.rounds, self.mean_accepted_length
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(accepted: &[usize]) -> SpecStats {
        let mut s = SpecStats::new(7);
        for &m in accepted {
            s.record(7, m);
        }
        s
    }

    #[test]
    fn a_draft_that_accepts_nothing_is_reported_once() {
        let mut c = AcceptanceCheck::new();
        // Ten rounds are not enough to judge; the next generation completes the sixteen.
        assert_eq!(c.observe(&stats(&[0; 10])), None);
        assert!(!c.judged());
        let low = c.observe(&stats(&[0, 1, 0, 0, 0, 0, 0, 0, 3, 3])).expect("judged low");
        assert_eq!(low.rounds, CHECK_ROUNDS);
        // Only the first six of the second generation count: 16 rounds, one accepted draft.
        assert!((low.mean_accepted_length - 17.0 / 16.0).abs() < 1e-12, "{low:?}");
        assert!(low.to_string().contains("16 rounds committed 1.06 tokens"), "{low}");
        assert!(c.judged());
        assert_eq!(c.observe(&stats(&[0; 40])), None, "judged once");
    }

    #[test]
    fn a_working_draft_is_not_reported() {
        let mut c = AcceptanceCheck::new();
        // τ = 2.0 (the demo coder's range) is not low; around the bound, 4 accepted drafts in
        // 16 rounds (1.25) are and 5 (1.3125) are not.
        assert_eq!(c.observe(&stats(&[1; 20])), None);
        assert!(c.judged());
        for (accepted, low) in [(4, true), (5, false)] {
            let m: Vec<usize> = (0..CHECK_ROUNDS).map(|i| usize::from(i < accepted)).collect();
            assert_eq!(AcceptanceCheck::new().observe(&stats(&m)).is_some(), low, "{accepted} accepted");
        }
    }

    #[test]
    fn rounds_that_verified_less_than_the_block_are_not_judged() {
        // A budget verifying one draft a round commits at most 2 tokens whatever the draft: 40
        // such rounds say nothing; full-block rounds after them are judged alone.
        let mut c = AcceptanceCheck::new();
        let mut short = SpecStats::new(7);
        for _ in 0..40 {
            short.record(1, 0);
        }
        assert_eq!(c.observe(&short), None);
        assert!(!c.judged());
        assert_eq!(c.observe(&stats(&[2; CHECK_ROUNDS])), None, "τ 3 on full blocks");
        assert!(c.judged());
    }
}
