//! The loops' callback contract (issue 28): `GenerateOptions::logprobs` changes no token (the
//! host-logits path picks what the device-argmax path picks), every reported logprob is the f64
//! log_softmax of the target's raw row that produced the token (checked against one plain
//! forward over prompt + output), and a `ControlFlow::Break` ends generation right after its
//! token without changing any earlier one.

use dspark_model::checkpoint::draft_config::MarkovKind;
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::testing::{random_draft, target_config, target_weights, DraftSpec};
use dspark_model::{LogitRows, TargetModel};
use dspark_spec::sampler::SamplingParams;
use dspark_spec::{
    greedy, sample, speculative, speculative_sampled, CostTable, DraftLaw, Emitted, GenerateOptions, Generation,
    StopReason, VerifyLen,
};
use std::ops::ControlFlow;

fn pair(seed: u64, vocab: usize) -> (CpuQwen3, CpuDraft) {
    let cfg = target_config(vocab, 16, 2, 2, 1, 8, 96);
    let w = target_weights(seed, &cfg);
    let spec = DraftSpec {
        layers: 1,
        block_size: 4,
        target_layer_ids: vec![0, 1],
        markov_rank: 4,
        markov_kind: MarkovKind::Vanilla,
        confidence_head: true,
        confidence_with_markov: true,
    };
    let draft = random_draft(seed ^ 0xD5, &cfg, &w, &spec);
    (CpuQwen3::new(cfg, w), draft)
}

fn opts(max_tokens: usize, logprobs: Option<usize>) -> GenerateOptions {
    GenerateOptions { max_tokens, eos_token_ids: vec![], logprobs }
}

fn sampling(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 3, top_p: 0.9, min_p: 0.0, seed }
}

/// Which loop a case runs.
#[derive(Clone, Copy, Debug)]
enum Loop {
    Greedy,
    Speculative(usize),
    SpeculativeAuto,
    Sample,
    SpeculativeSampled(DraftLaw),
}

const LOOPS: [Loop; 7] = [
    Loop::Greedy,
    Loop::Speculative(0),
    Loop::Speculative(3),
    Loop::SpeculativeAuto,
    Loop::Sample,
    Loop::SpeculativeSampled(DraftLaw::Sampled),
    Loop::SpeculativeSampled(DraftLaw::Greedy),
];

fn run(
    l: Loop,
    t: &mut CpuQwen3,
    d: &mut CpuDraft,
    prompt: &[u32],
    o: &GenerateOptions,
    seed: u64,
    on: impl FnMut(&Emitted) -> ControlFlow<()>,
) -> Generation {
    let auto = VerifyLen::Auto(CostTable { seconds: (0..=4).map(|n| 1.0 + 0.2 * n as f64).collect() });
    match l {
        Loop::Greedy => greedy(t, prompt, o, on),
        Loop::Speculative(k) => speculative(t, d, prompt, o, &VerifyLen::Fixed(k), on),
        Loop::SpeculativeAuto => speculative(t, d, prompt, o, &auto, on),
        Loop::Sample => sample(t, prompt, o, &sampling(seed), on),
        Loop::SpeculativeSampled(law) => {
            speculative_sampled(t, d, prompt, o, &VerifyLen::Fixed(3), &sampling(seed), law, on)
        }
    }
    .unwrap()
}

/// f64 log_softmax of `row` at `i`, computed plainly.
fn log_softmax(row: &[f32], i: usize) -> f64 {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    row[i] as f64 - lse
}

#[test]
fn logprobs_change_no_token_and_equal_a_plain_forwards_log_softmax() {
    for seed in 0..12u64 {
        let vocab = [6, 11, 40][seed as usize % 3];
        let (mut t, mut d) = pair(seed, vocab);
        let prompt: Vec<u32> = (0..1 + seed as u32 % 5).map(|i| (i * 7 + seed as u32) % vocab as u32).collect();
        let max_tokens = 8 + seed as usize * 3;
        for l in LOOPS {
            let off = run(l, &mut t, &mut d, &prompt, &opts(max_tokens, None), seed, |e| {
                assert!(e.logprob.is_none());
                ControlFlow::Continue(())
            });
            let top_n = (seed % 4) as usize;
            let mut seen: Vec<Emitted> = Vec::new();
            let on = run(l, &mut t, &mut d, &prompt, &opts(max_tokens, Some(top_n)), seed, |e| {
                seen.push(e.clone());
                ControlFlow::Continue(())
            });
            let ctx = format!("seed {seed} {l:?}");
            assert_eq!(on.tokens, off.tokens, "{ctx}: tokens");
            assert_eq!(on.stop, off.stop, "{ctx}: stop");
            assert_eq!(on.spec, off.spec, "{ctx}: rounds");
            assert_eq!(seen.iter().map(|e| e.token).collect::<Vec<_>>(), on.tokens, "{ctx}: streamed");

            // One forward over prompt + output: row prompt.len() - 1 + i produced token i.
            let mut input = prompt.clone();
            input.extend_from_slice(&on.tokens[..on.tokens.len() - 1]);
            t.truncate(0).unwrap();
            let f = t.forward(&input, LogitRows::All).unwrap();
            for (i, e) in seen.iter().enumerate() {
                let row = f.row(prompt.len() - 1 + i, vocab);
                let lp = e.logprob.as_ref().expect("logprobs asked");
                let want = log_softmax(row, e.token as usize);
                assert!((lp.logprob - want).abs() < 1e-4, "{ctx} token {i}: {} vs {want}", lp.logprob);
                assert!(lp.logprob <= 0.0);
                assert_eq!(lp.top.len(), top_n.min(vocab), "{ctx}");
                let mut order: Vec<usize> = (0..vocab).collect();
                order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                for (j, &(id, x)) in lp.top.iter().enumerate() {
                    assert_eq!(id as usize, order[j], "{ctx} token {i}: top {j}");
                    assert!((x - log_softmax(row, id as usize)).abs() < 1e-4);
                }
                if matches!(l, Loop::Greedy | Loop::Speculative(_) | Loop::SpeculativeAuto) {
                    // Greedy: the chosen token is the row's most likely.
                    assert_eq!(e.token as usize, order[0], "{ctx} token {i}");
                }
            }
        }
    }
}

#[test]
fn a_break_ends_generation_after_its_token_and_changes_none_before() {
    for seed in 0..6u64 {
        let (mut t, mut d) = pair(seed + 100, 9);
        let prompt = [1u32, 4, 2];
        for l in LOOPS {
            for lp in [None, Some(2)] {
                let full = run(l, &mut t, &mut d, &prompt, &opts(24, lp), seed, |_| ControlFlow::Continue(()));
                assert_eq!(full.tokens.len(), 24);
                for at in [0usize, 1, 5, 13, 22] {
                    let mut n = 0;
                    let g = run(l, &mut t, &mut d, &prompt, &opts(24, lp), seed, |_| {
                        n += 1;
                        if n > at {
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        }
                    });
                    let ctx = format!("seed {seed} {l:?} break at {at}");
                    assert_eq!(g.tokens, full.tokens[..=at], "{ctx}");
                    assert_eq!(g.stop, StopReason::Stopped, "{ctx}");
                    assert_eq!(n, at + 1, "{ctx}: no token after the break");
                }
                // A break on the last token reports the token's own reason.
                let mut n = 0;
                let g = run(l, &mut t, &mut d, &prompt, &opts(24, lp), seed, |_| {
                    n += 1;
                    if n == 24 {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                });
                assert_eq!(g.stop, StopReason::MaxTokens);
                assert_eq!(g.tokens, full.tokens);
            }
        }
    }
}
