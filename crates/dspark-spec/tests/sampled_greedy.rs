//! Temperature 0 through the sampling entry points is greedy decoding, bit for bit (issue 27,
//! Tests (d)): `speculative_sampled` at T = 0 equals `speculative` (tokens, stop and per-round
//! stats) for either draft law, and `sample` at T = 0 equals `greedy` — on random tiny pairs (a
//! proptest of a few dozen cases, as tests/lossless.rs) and on the golden fixture runs
//! (transformers' greedy tokens, nemo-automodel's accepted lengths).

use dspark_model::checkpoint::draft_config::MarkovKind;
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::testing::{random_draft, target_config, target_weights, DraftSpec};
use dspark_model::{Drafter, TargetModel};
use dspark_spec::sampler::SamplingParams;
use dspark_spec::{greedy, sample, speculative, speculative_sampled, CostTable, DraftLaw, GenerateOptions, VerifyLen};
use proptest::prelude::*;
use serde_json::Value;
use std::ops::ControlFlow;
use std::path::PathBuf;

/// Greedy parameters with non-default filters and seed: temperature 0 must ignore them all.
fn t0(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.0, top_k: 3, top_p: 0.5, min_p: 0.2, seed }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]
    #[test]
    fn temperature_zero_is_greedy_on_random_pairs(
        seed in any::<u64>(),
        vocab in 4usize..24,
        block in 1usize..=6,
        kind in prop_oneof![Just(MarkovKind::Vanilla), Just(MarkovKind::Gated), Just(MarkovKind::Rnn)],
        rank_sel in 0usize..3,
        plen in 1usize..8,
        max_tokens in 0usize..30,
        verify_sel in 0usize..8,
        with_eos in any::<bool>(),
    ) {
        let cfg = target_config(vocab, 16, 2, 2, 1, 8, 96);
        let w = target_weights(seed, &cfg);
        let mut target = CpuQwen3::new(cfg.clone(), w.clone());
        let spec = DraftSpec {
            layers: 1,
            block_size: block,
            target_layer_ids: vec![0],
            markov_rank: [0, 4, 8][rank_sel],
            markov_kind: kind,
            confidence_head: seed & 1 == 1,
            confidence_with_markov: seed & 2 == 2,
        };
        let mut draft = random_draft(seed ^ 0x5A, &cfg, &w, &spec);
        let prompt: Vec<u32> = (0..plen).map(|i| ((seed >> (i * 5)) % vocab as u64) as u32).collect();
        let opts = GenerateOptions {
            max_tokens,
            eos_token_ids: if with_eos { vec![(seed % vocab as u64) as u32] } else { vec![] },
            logprobs: None,
        };
        let verify = if verify_sel == 7 {
            VerifyLen::Auto(CostTable { seconds: (0..=block).map(|n| 1.0 + 0.2 * n as f64).collect() })
        } else {
            VerifyLen::Fixed(verify_sel)
        };
        let want = speculative(&mut target, &mut draft, &prompt, &opts, &verify, |_| ControlFlow::Continue(())).unwrap();
        for law in [DraftLaw::Greedy, DraftLaw::Sampled] {
            let got = speculative_sampled(&mut target, &mut draft, &prompt, &opts, &verify, &t0(seed), law, |_| ControlFlow::Continue(()))
                .unwrap();
            prop_assert_eq!(&got.tokens, &want.tokens);
            prop_assert_eq!(got.stop, want.stop);
            prop_assert_eq!(&got.spec, &want.spec);
        }
        let plain = greedy(&mut target, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap();
        let sampled = sample(&mut target, &prompt, &opts, &t0(seed), |_| ControlFlow::Continue(())).unwrap();
        prop_assert_eq!(&sampled.tokens, &plain.tokens);
        prop_assert_eq!(sampled.stop, plain.stop);
        prop_assert_eq!(&sampled.tokens, &want.tokens);
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

#[test]
fn temperature_zero_reproduces_the_golden_runs() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    for name in [
        "dspark-tiny-vanilla",
        "dspark-tiny-gated",
        "dspark-tiny-rnn",
        "dflash-tiny",
        "dspark-tiny-block4",
        "dspark-tiny-copy",
        "dspark-tiny-speculators",
    ] {
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(root.join(format!("fixtures/golden/{name}.json"))).unwrap())
                .unwrap();
        let mut target = CpuQwen3::load(&root.join("fixtures").join(json["target"].as_str().unwrap())).unwrap();
        let mut draft = CpuDraft::load(&root.join("fixtures").join(name), target.config(), target.weights()).unwrap();
        let opts = GenerateOptions {
            max_tokens: json["max_new_tokens"].as_u64().unwrap() as usize,
            eos_token_ids: ids(&json["eos_token_ids"]),
            logprobs: None,
        };
        let prompt = ids(&json["prompt_ids"]);
        let verify = VerifyLen::Fixed(draft.block_size());
        let want =
            speculative(&mut target, &mut draft, &prompt, &opts, &verify, |_| ControlFlow::Continue(())).unwrap();
        for law in [DraftLaw::Greedy, DraftLaw::Sampled] {
            let got = speculative_sampled(&mut target, &mut draft, &prompt, &opts, &verify, &t0(7), law, |_| {
                ControlFlow::Continue(())
            })
            .unwrap();
            assert_eq!(got.tokens, ids(&json["tokens"]), "{name} {law:?}: tokens");
            assert_eq!(got.tokens, ids(&json["greedy_tokens"]), "{name} {law:?}: tokens vs transformers greedy");
            assert_eq!(got.spec, want.spec, "{name} {law:?}: rounds");
        }
        let plain = sample(&mut target, &prompt, &opts, &t0(7), |_| ControlFlow::Continue(())).unwrap();
        assert_eq!(plain.tokens, ids(&json["greedy_tokens"]), "{name}: plain");
    }
}
