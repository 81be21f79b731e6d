//! Distributional losslessness on real (tiny, random) models (issue 27, Tests (b); SAMPLING.md
//! §2.3 L3): a random Qwen3 target with a random DSpark draft (CPU reference models, vocabulary
//! of 5, block of 3), the exact law of the first 3 generated tokens — across round boundaries —
//! computed from the target alone (1 + V + V² forwards), against seeded speculative runs by
//! chi-square at α = 1e-4 (~400 expected per cell; the faults, which fail by far, on fewer
//! runs), for both draft laws with filters off and on, plain sampling as the control; and the
//! four faults must fail it here too. Plus seeded reproducibility (Tests (e)).

mod sampled_law;

use dspark_model::checkpoint::draft_config::MarkovKind;
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::testing::{random_draft, target_config, target_weights, DraftSpec};
use dspark_spec::sampled::Fault;
use dspark_spec::sampler::SamplingParams;
use dspark_spec::{sample, speculative_sampled, DraftLaw, GenerateOptions, VerifyLen};
use sampled_law::{exact_law, observe, runs_for, ChiSquare, Mode};
use std::ops::ControlFlow;

const V: usize = 5;
const B: usize = 3;
const LEN: usize = 3;
const PROMPT: [u32; 3] = [1, 3, 2];

fn pair(kind: MarkovKind) -> (CpuQwen3, CpuDraft) {
    let cfg = target_config(V, 16, 2, 2, 1, 8, 64);
    let w = target_weights(21, &cfg);
    let spec = DraftSpec {
        layers: 1,
        block_size: B,
        target_layer_ids: vec![0],
        markov_rank: 4,
        markov_kind: kind,
        confidence_head: true,
        confidence_with_markov: true,
    };
    let draft = random_draft(22, &cfg, &w, &spec);
    (CpuQwen3::new(cfg, w), draft)
}

/// Temperature 1 with the filters off; with them on, 1.5 so that they cut a spread law.
fn params(top_k: usize, top_p: f32) -> SamplingParams {
    let temperature = if top_k == 0 && top_p == 1.0 { 1.0 } else { 1.5 };
    SamplingParams { temperature, top_k, top_p, min_p: 0.0, seed: 0 }
}

fn run(mode: Mode, kind: MarkovKind, params: SamplingParams, seed0: u64) -> ChiSquare {
    let (mut target, mut draft) = pair(kind);
    let law = exact_law(&mut target, &PROMPT, LEN, &params, &[]);
    let per_cell = if matches!(mode, Mode::Spec(_, Fault::None) | Mode::Plain) { 400 } else { 100 };
    let n = runs_for(&law, per_cell, 6_000, 50_000);
    let seen = observe(&mut target, &mut draft, &PROMPT, LEN, &params, &VerifyLen::Fixed(B), &[], mode, n, seed0);
    let chi = ChiSquare::new(&law, &seen);
    eprintln!("{mode:?} {kind:?} {params:?}: {chi:?}");
    chi
}

#[test]
fn plain_sampling_control() {
    let chi = run(Mode::Plain, MarkovKind::Vanilla, params(0, 1.0), 10_000_000);
    assert!(chi.passes(), "{chi:?}");
}

#[test]
fn sampled_draft_filters_off_and_on() {
    for (p, kind) in [(params(0, 1.0), MarkovKind::Vanilla), (params(4, 0.9), MarkovKind::Rnn)] {
        let chi = run(Mode::Spec(DraftLaw::Sampled, Fault::None), kind, p, 11_000_000);
        assert!(chi.passes(), "{p:?}: {chi:?}");
    }
}

#[test]
fn greedy_draft_filters_off_and_on() {
    for (p, kind) in [(params(0, 1.0), MarkovKind::Gated), (params(4, 0.9), MarkovKind::Vanilla)] {
        let chi = run(Mode::Spec(DraftLaw::Greedy, Fault::None), kind, p, 12_000_000);
        assert!(chi.passes(), "{p:?}: {chi:?}");
    }
}

#[test]
fn faults_are_caught_on_real_models() {
    for fault in [Fault::QWithoutMarkovBias, Fault::ResidualIsTarget, Fault::OffByOneRow, Fault::PeekingVerifyLen] {
        let chi = run(Mode::Spec(DraftLaw::Sampled, fault), MarkovKind::Vanilla, params(0, 1.0), 13_000_000);
        assert!(!chi.passes(), "{fault:?} went undetected: {chi:?}");
    }
}

/// The same seed gives the same tokens (and rounds), plain and speculative each; another seed
/// gives another run.
#[test]
fn seeded_runs_reproduce() {
    let (mut target, mut draft) = pair(MarkovKind::Vanilla);
    let opts = GenerateOptions { max_tokens: 40, eos_token_ids: vec![], logprobs: None };
    let p = SamplingParams { temperature: 0.8, top_k: 0, top_p: 0.95, min_p: 0.0, seed: 1234 };
    let other = SamplingParams { seed: 4321, ..p };
    let plain = |t: &mut CpuQwen3, p: &SamplingParams| {
        sample(t, &PROMPT, &opts, p, |_| ControlFlow::Continue(())).unwrap().tokens
    };
    assert_eq!(plain(&mut target, &p), plain(&mut target, &p));
    assert_ne!(plain(&mut target, &p), plain(&mut target, &other));
    for law in [DraftLaw::Sampled, DraftLaw::Greedy] {
        let mut spec = |p: &SamplingParams| {
            let mut streamed = Vec::new();
            let g = speculative_sampled(&mut target, &mut draft, &PROMPT, &opts, &VerifyLen::Fixed(B), p, law, |t| {
                streamed.push(t.token);
                ControlFlow::Continue(())
            })
            .unwrap();
            assert_eq!(streamed, g.tokens);
            (g.tokens, g.spec.unwrap())
        };
        let (a, b) = (spec(&p), spec(&p));
        assert_eq!(a, b, "{law:?}");
        assert_eq!(a.0.len(), 40);
        assert_ne!(a.0, spec(&other).0, "{law:?}");
    }
}
