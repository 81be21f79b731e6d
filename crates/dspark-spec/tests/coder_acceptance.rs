//! Regression guard for the embedded demo (fixtures/coder-target + fixtures/coder-draft,
//! trained by train/train_coder.py): over the 12 held-out prompts of
//! train/heldout_prompts.json, 64 tokens each, the pooled mean accepted length (tokens per
//! round, counting the bonus token) stays above a floor. Measured 2.30 on 2026-11-30 with
//! this exact setup (train/RESULTS.md); the floor is 2.0. It is a property of the draft and
//! the loop, not a timing — and the output must still equal plain greedy.

use dspark_model::checkpoint::tokenizer::{eos_ids, Tokenizer};
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::TargetModel;
use dspark_spec::{greedy, speculative, GenerateOptions, VerifyLen};
use std::ops::ControlFlow;
use std::path::PathBuf;

#[test]
fn demo_draft_keeps_its_acceptance_on_held_out_code() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tdir = root.join("fixtures/coder-target");
    let mut target = CpuQwen3::load(&tdir).unwrap();
    let mut draft = CpuDraft::load(&root.join("fixtures/coder-draft"), target.config(), target.weights()).unwrap();
    let tok = Tokenizer::from_dir(&tdir).unwrap().expect("the demo target ships a tokenizer");
    let prompts: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(root.join("train/heldout_prompts.json")).unwrap()).unwrap();
    assert_eq!(prompts.len(), 12);
    let opts = GenerateOptions {
        max_tokens: 64,
        eos_token_ids: eos_ids(&tdir, &target.config().eos_token_ids).unwrap(),
        logprobs: None,
    };
    let (mut tokens, mut rounds) = (0usize, 0usize);
    for p in &prompts {
        let ids = tok.encode(p).unwrap();
        let s = speculative(&mut target, &mut draft, &ids, &opts, &VerifyLen::Fixed(7), |_| ControlFlow::Continue(()))
            .unwrap();
        let plain = greedy(&mut target, &ids, &opts, |_| ControlFlow::Continue(())).unwrap();
        assert_eq!(s.tokens, plain.tokens);
        let stats = s.spec.unwrap();
        rounds += stats.rounds();
        tokens += stats.accepted.iter().map(|m| m + 1).sum::<usize>();
    }
    let tau = tokens as f64 / rounds as f64;
    eprintln!("pooled mean accepted length over 12 held-out prompts: {tau:.3}");
    assert!(tau >= 2.0, "mean accepted length {tau:.3} fell below the floor 2.0 (measured 2.30)");
}
