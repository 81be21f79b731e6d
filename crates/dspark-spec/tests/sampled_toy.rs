//! Distributional losslessness of speculative sampling on a toy DSpark-shaped pair (issue 27,
//! Tests (a); SAMPLING.md §2.3 L2): the joint law of the first 3 generated tokens, computed
//! exactly from the target's tables, against many seeded runs by Pearson's chi-square at
//! α = 1e-4 (~400 expected per cell). Both draft laws, filters off and on, `auto` verify length,
//! an eos inside blocks; and each deliberate fault of `dspark_spec::sampled::Fault` must fail
//! the same test (the test's power, kept as tests). Seeds are fixed: CI is deterministic.

mod sampled_law;

use dspark_spec::sampled::Fault;
use dspark_spec::sampler::SamplingParams;
use dspark_spec::{CostTable, DraftLaw, VerifyLen};
use sampled_law::{exact_law, observe, runs_for, ChiSquare, Mode, ToyDraft, ToyTarget};
use std::ops::ControlFlow;

const V: usize = 5;
const B: usize = 3;
const LEN: usize = 3;
const PROMPT: [u32; 2] = [1, 3];

fn params(top_k: usize, top_p: f32) -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k, top_p, min_p: 0.0, seed: 0 }
}

fn off() -> SamplingParams {
    params(0, 1.0)
}

fn on() -> SamplingParams {
    params(4, 0.9)
}

fn run(mode: Mode, params: SamplingParams, verify: VerifyLen, eos: &[u32], seed0: u64) -> ChiSquare {
    let mut target = ToyTarget::new(11, V, 1.3);
    let mut draft = ToyDraft::new(12, V, B, 1.3, 2.0);
    let law = exact_law(&mut target, &PROMPT, LEN, &params, eos);
    let n = runs_for(&law, 400, 10_000, 50_000);
    let seen = observe(&mut target, &mut draft, &PROMPT, LEN, &params, &verify, eos, mode, n, seed0);
    let chi = ChiSquare::new(&law, &seen);
    eprintln!("{mode:?} {params:?}: {chi:?}");
    chi
}

fn lossless(mode: Mode, params: SamplingParams) {
    let chi = run(mode, params, VerifyLen::Fixed(B), &[], 1_000_000);
    assert!(chi.passes(), "{mode:?} {params:?}: {chi:?}");
}

fn caught(fault: Fault, law: DraftLaw, params: SamplingParams) {
    let chi = run(Mode::Spec(law, fault), params, VerifyLen::Fixed(B), &[], 2_000_000);
    assert!(!chi.passes(), "{fault:?} went undetected: {chi:?}");
}

#[test]
fn plain_sampling_control() {
    lossless(Mode::Plain, off());
    lossless(Mode::Plain, on());
}

#[test]
fn sampled_draft_filters_off() {
    lossless(Mode::Spec(DraftLaw::Sampled, Fault::None), off());
}

#[test]
fn sampled_draft_filters_on() {
    lossless(Mode::Spec(DraftLaw::Sampled, Fault::None), on());
}

/// min-p on top of top-k (and a temperature above 1, so the filters cut a spread law).
#[test]
fn sampled_and_greedy_drafts_with_min_p() {
    let p = SamplingParams { temperature: 1.4, top_k: 4, top_p: 1.0, min_p: 0.15, seed: 0 };
    lossless(Mode::Spec(DraftLaw::Sampled, Fault::None), p);
    lossless(Mode::Spec(DraftLaw::Greedy, Fault::None), p);
}

#[test]
fn greedy_draft_filters_off() {
    lossless(Mode::Spec(DraftLaw::Greedy, Fault::None), off());
}

#[test]
fn greedy_draft_filters_on() {
    lossless(Mode::Spec(DraftLaw::Greedy, Fault::None), on());
}

/// `auto` picks k from survival computed along the sampled chain (the toy's confidence is a
/// table of the previous token): admission of d_j reads only d_{<j}, so the law holds.
#[test]
fn auto_verify_length_stays_lossless() {
    let costs = VerifyLen::Auto(CostTable { seconds: (0..=B).map(|n| 1.0 + 0.3 * n as f64).collect() });
    for law in [DraftLaw::Sampled, DraftLaw::Greedy] {
        let chi = run(Mode::Spec(law, Fault::None), off(), costs.clone(), &[], 3_000_000);
        assert!(chi.passes(), "auto, {law:?}: {chi:?}");
    }
}

/// Token 2 ends generation: an accepted eos inside a block ends the output with no bonus.
#[test]
fn eos_inside_blocks() {
    let chi = run(Mode::Spec(DraftLaw::Sampled, Fault::None), off(), VerifyLen::Fixed(B), &[2], 4_000_000);
    assert!(chi.passes(), "{chi:?}");
}

#[test]
fn fault_q_without_markov_bias_is_caught() {
    caught(Fault::QWithoutMarkovBias, DraftLaw::Sampled, off());
}

#[test]
fn fault_residual_as_target_is_caught() {
    caught(Fault::ResidualIsTarget, DraftLaw::Sampled, off());
    caught(Fault::ResidualIsTarget, DraftLaw::Greedy, off());
}

#[test]
fn fault_off_by_one_row_is_caught() {
    caught(Fault::OffByOneRow, DraftLaw::Sampled, off());
    caught(Fault::OffByOneRow, DraftLaw::Greedy, on());
}

#[test]
fn fault_peeking_verify_length_is_caught() {
    caught(Fault::PeekingVerifyLen, DraftLaw::Sampled, off());
}

/// The law tests are not vacuous: on the toy pair, rounds with zero, partial and full
/// acceptance all occur under both laws (so the residual and the bonus paths are both taken).
#[test]
fn toy_rounds_cover_every_acceptance_kind() {
    let mut target = ToyTarget::new(11, V, 1.3);
    let mut draft = ToyDraft::new(12, V, B, 1.3, 2.0);
    let opts = dspark_spec::GenerateOptions { max_tokens: 12, eos_token_ids: vec![], logprobs: None };
    for law in [DraftLaw::Sampled, DraftLaw::Greedy] {
        let (mut zero, mut partial, mut full) = (0, 0, 0);
        for seed in 0..300 {
            let p = SamplingParams { seed, ..off() };
            let g = dspark_spec::speculative_sampled(
                &mut target,
                &mut draft,
                &PROMPT,
                &opts,
                &VerifyLen::Fixed(B),
                &p,
                law,
                |_| ControlFlow::Continue(()),
            )
            .unwrap();
            let s = g.spec.unwrap();
            for (&m, &k) in s.accepted.iter().zip(&s.verified) {
                match m {
                    _ if k == 0 => {}
                    0 => zero += 1,
                    m if m == k => full += 1,
                    _ => partial += 1,
                }
            }
        }
        eprintln!("{law:?}: zero {zero}, partial {partial}, full {full}");
        assert!(zero > 0 && partial > 0 && full > 0, "{law:?}: zero {zero}, partial {partial}, full {full}");
    }
}

/// The documented uniform order, replayed by hand for the first round (SAMPLING's L1 check with
/// the stream's own uniforms): U(0) the prompt's token; U(1..=B) the draft's chain;
/// U(B+1..=2B) the accept tests of rows 0..B; U(2B+1) the residual or bonus draw.
#[test]
fn first_round_follows_the_documented_uniform_order() {
    use dspark_model::Drafter;
    use dspark_spec::sampler::{draw, transform, Uniforms};
    let (mut paths_rejected, mut paths_full) = (0, 0);
    for seed in 0..200u64 {
        let p = SamplingParams { seed, ..off() };
        let u = |i: u64| Uniforms::at(seed, i);
        let target = ToyTarget::new(11, V, 1.3);
        let mut draft = ToyDraft::new(12, V, B, 1.3, 2.0);
        let mut prefix: Vec<u32> = PROMPT.to_vec();
        let t0 = draw(&transform(&p, target.logits_after(&prefix)), u(0));
        prefix.push(t0);
        draft.append_context(&PROMPT.map(|t| t as f32)).unwrap();
        let mut slot = 0;
        let sp = draft
            .propose_sampled(t0, &mut |z: &[f32]| {
                let q = transform(&p, z);
                slot += 1;
                (draw(&q, u(slot)), q)
            })
            .unwrap();
        let mut want = vec![t0];
        let mut m = 0;
        let mut next = None;
        for i in 0..B {
            let pp = transform(&p, target.logits_after(&prefix));
            let d = sp.tokens[i] as usize;
            if u(1 + B as u64 + i as u64) < pp[d] / sp.q[i][d] {
                m += 1;
                want.push(d as u32);
                prefix.push(d as u32);
                continue;
            }
            let residual: Vec<f64> = pp.iter().zip(&sp.q[i]).map(|(a, b)| (a - b).max(0.0)).collect();
            next = Some(draw(&residual, u(1 + 2 * B as u64)));
            break;
        }
        let next = next.unwrap_or_else(|| draw(&transform(&p, target.logits_after(&prefix)), u(1 + 2 * B as u64)));
        want.push(next);
        if m == B {
            paths_full += 1;
        } else {
            paths_rejected += 1;
        }
        let (mut t, mut d) = (ToyTarget::new(11, V, 1.3), ToyDraft::new(12, V, B, 1.3, 2.0));
        let opts = dspark_spec::GenerateOptions { max_tokens: 2 * B + 2, eos_token_ids: vec![], logprobs: None };
        let g = dspark_spec::speculative_sampled(
            &mut t,
            &mut d,
            &PROMPT,
            &opts,
            &VerifyLen::Fixed(B),
            &p,
            DraftLaw::Sampled,
            |_| ControlFlow::Continue(()),
        )
        .unwrap();
        assert_eq!(&g.tokens[..want.len()], &want[..], "seed {seed}");
        assert_eq!(g.spec.unwrap().accepted[0], m, "seed {seed}");
    }
    assert!(paths_rejected > 0 && paths_full > 0, "rejected {paths_rejected}, full {paths_full}");
}
