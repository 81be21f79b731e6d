//! Off the happy path: an oracle draft that proposes the target's own greedy continuation,
//! with errors injected at chosen slots, must produce exactly the accepted lengths that the
//! injected errors imply. The oracle also checks, every round, that the loop hands it the
//! tapped target features of exactly the newly committed positions (anchor + accepted drafts),
//! against features from one forward over the whole final sequence.

use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::{Drafter, LogitRows, Proposal, Result, TargetModel};
use dspark_spec::{greedy, speculative, GenerateOptions, VerifyLen};
use std::ops::ControlFlow;
use std::path::PathBuf;

struct Oracle {
    /// Prompt followed by the target's greedy continuation.
    seq: Vec<u32>,
    /// Reference tapped features for every position of `seq`, `[len, row]`.
    features: Vec<f32>,
    row: usize,
    taps: Vec<usize>,
    block: usize,
    vocab: u32,
    /// Slots to corrupt, per round.
    errors: Vec<Vec<usize>>,
    round: usize,
    ctx_len: usize,
}

impl Drafter for Oracle {
    fn block_size(&self) -> usize {
        self.block
    }
    fn target_layer_ids(&self) -> &[usize] {
        &self.taps
    }
    fn context_len(&self) -> usize {
        self.ctx_len
    }
    fn reset(&mut self) {
        self.ctx_len = 0;
        self.round = 0;
    }
    fn append_context(&mut self, features: &[f32]) -> Result<()> {
        let n = features.len() / self.row;
        let want = &self.features[self.ctx_len * self.row..(self.ctx_len + n) * self.row];
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = features.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff <= 1e-4 * scale,
            "round {}: context rows {}..{} differ from the reference by {diff}",
            self.round,
            self.ctx_len,
            self.ctx_len + n
        );
        self.ctx_len += n;
        Ok(())
    }
    fn propose(&mut self, anchor: u32) -> Result<Proposal> {
        let p = self.ctx_len;
        assert_eq!(anchor, self.seq[p], "round {}: anchor is not the token at position {p}", self.round);
        let mut tokens: Vec<u32> = (1..=self.block).map(|s| self.seq.get(p + s).copied().unwrap_or(0)).collect();
        for &s in self.errors.get(self.round).map(Vec::as_slice).unwrap_or(&[]) {
            tokens[s] = (tokens[s] + 1) % self.vocab;
        }
        self.round += 1;
        Ok(Proposal { tokens, survival: None })
    }
}

#[test]
fn injected_errors_give_exactly_the_expected_accepted_lengths() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3-tiny-f32");
    let mut target = CpuQwen3::load(&dir).unwrap();
    let prompt: Vec<u32> = vec![17, 300, 42, 99, 7, 256, 3, 128];
    let max_tokens = 64;
    let opts = GenerateOptions { max_tokens, eos_token_ids: vec![], logprobs: None };
    let plain = greedy(&mut target, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(plain.tokens.len(), max_tokens, "the oracle needs an eos-free continuation");

    let seq: Vec<u32> = prompt.iter().chain(&plain.tokens).copied().collect();
    let taps = vec![0, 2];
    target.truncate(0).unwrap();
    target.set_capture(&taps).unwrap();
    let features = target.forward(&seq, LogitRows::Last).unwrap().captured;
    let row = taps.len() * target.config().hidden_size;

    let block = 7;
    let errors: Vec<Vec<usize>> =
        vec![vec![], vec![0], vec![3], vec![6], vec![1, 4], vec![], vec![2], vec![5, 6], vec![0, 1]];
    // Expected accepted lengths: the first corrupted slot, capped by the verify length, which
    // the loop caps by the tokens still wanted (max_tokens − emitted − 1).
    let mut expected = Vec::new();
    let mut emitted = 1; // the anchor from prefill
    let mut round = 0;
    while emitted < max_tokens {
        let k = block.min(max_tokens - emitted - 1);
        let first_err = errors.get(round).and_then(|e| e.iter().min().copied()).unwrap_or(block);
        let m = first_err.min(k);
        expected.push(m);
        emitted += m + 1;
        round += 1;
    }

    let mut oracle = Oracle { seq, features, row, taps, block, vocab: 512, errors, round: 0, ctx_len: 0 };
    let spec =
        speculative(&mut target, &mut oracle, &prompt, &opts, &VerifyLen::Fixed(block), |_| ControlFlow::Continue(()))
            .unwrap();
    assert_eq!(spec.tokens, plain.tokens);
    let stats = spec.spec.unwrap();
    assert_eq!(stats.accepted, expected);
    assert_eq!(&stats.accepted[..5], &[7, 0, 3, 6, 1]);
    assert_eq!(stats.accepted_histogram().iter().sum::<usize>(), stats.rounds());
}
