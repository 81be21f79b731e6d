//! Tensor parallelism's reference (issue #32, `dspark_model::cpu::tp`): a target split over N
//! ranks, collectives as sums in rank order.
//!
//! * N = 1 is the unsplit `CpuQwen3` bit for bit: logits, captures and ids, through prompts,
//!   verify-shaped steps, rollbacks and decode steps, with f32 and bf16 caches.
//! * N = 2 and 4 split the o_proj and down_proj sums in N parts, which moves the last bits: the
//!   logits stay within 1e-5 of N = 1 (max |Δ| / max |N = 1|, the bound stated in `tp.rs`); the
//!   gathered argmax equals the argmax of the rank's own full logits exactly; on the f32 fixture
//!   N = 2 decodes transformers' 64 greedy tokens, as N = 1 does.
//! * Speculative decoding over a split target equals plain greedy decoding of the same split
//!   target, token for token, at every N (the lossless invariant per N).
//! * An N the shapes do not divide is an error naming `--tensor-parallel`.

use dspark_kernels::cpu::argmax::argmax_rows;
use dspark_kernels::KvDtype;
use dspark_model::checkpoint::draft_config::MarkovKind;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::cpu::tp::CpuQwen3Tp;
use dspark_model::testing::{random_draft, rel_err, repo_root, target_config, target_weights, DraftSpec, Rng};
use dspark_model::{LogitRows, TargetModel};
use dspark_spec::{greedy, speculative, GenerateOptions, VerifyLen};
use std::ops::ControlFlow;

/// Bit-for-bit equality of two f32 slices.
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Random steps — a prompt, verify-shaped steps, rollbacks, decode steps — on `a` and `b`;
/// `check(step, logits a, logits b)` on every step's full logits, and every step's captures
/// and gathered ids: captures bit for bit when `exact`, ids always equal to each model's own
/// argmax.
fn run_steps(
    a: &mut dyn TargetModel,
    b: &mut CpuQwen3Tp,
    seed: u64,
    exact: bool,
    mut check: impl FnMut(usize, &[f32], &[f32]),
) {
    let vocab = a.config().vocab_size;
    let mut rng = Rng(seed);
    for m in [&mut *a, b as &mut dyn TargetModel] {
        m.set_capture(&[0, 1]).unwrap();
    }
    for step in 0..14 {
        let len = a.len();
        if step > 0 && rng.below(4) == 0 {
            let keep = rng.below(len + 1);
            a.truncate(keep).unwrap();
            b.truncate(keep).unwrap();
            continue;
        }
        let n = if step == 0 { 5 + rng.below(20) } else { 1 + rng.below(9) };
        let n = n.min(a.max_len() - len);
        if n == 0 {
            break;
        }
        let tokens: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
        let (fa, fb) = (a.forward(&tokens, LogitRows::All).unwrap(), b.forward(&tokens, LogitRows::All).unwrap());
        check(step, &fa.logits, &fb.logits);
        if exact {
            assert!(same(&fa.captured, &fb.captured), "seed {seed}, step {step}: captures");
        }
        // The gathered argmax (forward_greedy) is the argmax of the full logits, exactly.
        let (ga, gb) = {
            a.truncate(len).unwrap();
            b.truncate(len).unwrap();
            (a.forward_greedy(&tokens, LogitRows::All).unwrap(), b.forward_greedy(&tokens, LogitRows::All).unwrap())
        };
        let want_b: Vec<u32> = argmax_rows(&fb.logits, vocab).into_iter().map(|i| i as u32).collect();
        assert_eq!(gb.ids, want_b, "seed {seed}, step {step}: gathered ids vs the full logits' argmax");
        if exact {
            assert_eq!(ga.ids, gb.ids, "seed {seed}, step {step}: ids");
        }
    }
}

#[test]
fn one_rank_is_the_unsplit_model_bit_for_bit() {
    for seed in 0..6u64 {
        // 8 query heads over 4 KV heads, intermediate 136.
        let cfg = target_config(40 + seed as usize, 64, 2, 8, 4, 16, 96);
        let w = target_weights(seed, &cfg);
        for kv in [KvDtype::F32, KvDtype::Bf16] {
            let mut plain = CpuQwen3::new(cfg.clone(), w.clone()).with_kv_dtype(kv);
            let mut one = CpuQwen3Tp::new(cfg.clone(), &w, 1, kv).unwrap();
            run_steps(&mut plain, &mut one, seed, true, |step, a, b| {
                assert!(same(a, b), "seed {seed}, {kv:?}, step {step}: logits differ at N = 1");
            });
        }
    }
}

#[test]
fn more_ranks_stay_within_the_stated_numerics() {
    let mut worst = 0f32;
    for seed in 0..6u64 {
        let cfg = target_config(40 + seed as usize, 64, 2, 8, 4, 16, 96);
        let w = target_weights(seed, &cfg);
        for n in [2, 4] {
            let mut one = CpuQwen3Tp::new(cfg.clone(), &w, 1, KvDtype::F32).unwrap();
            let mut split = CpuQwen3Tp::new(cfg.clone(), &w, n, KvDtype::F32).unwrap();
            assert_eq!(split.ranks(), n);
            run_steps(&mut one, &mut split, seed + 100, false, |step, a, b| {
                let e = rel_err(b, a);
                worst = worst.max(e);
                assert!(e <= 1e-5, "seed {seed}, N = {n}, step {step}: logits rel err {e}");
            });
        }
    }
    eprintln!("N = 2, 4 against N = 1: worst logits rel err {worst:.2e}");
    // The f32 fixture (2 KV heads): N = 2 decodes transformers' greedy tokens, as N = 1.
    let dir = repo_root().join("fixtures/qwen3-tiny-f32");
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("fixtures/golden/qwen3-tiny-f32.json")).unwrap(),
    )
    .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let (prompt, want) = (ids(&golden["prompt_ids"]), ids(&golden["continuation"]));
    let base = CpuQwen3::load(&dir).unwrap();
    for n in [1, 2] {
        let mut t = CpuQwen3Tp::split(&base, n, KvDtype::F32).unwrap();
        let opts = GenerateOptions { max_tokens: want.len(), eos_token_ids: vec![], logprobs: None };
        let got = greedy(&mut t, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap();
        assert_eq!(got.tokens, want, "qwen3-tiny-f32 at N = {n}: transformers' greedy tokens");
    }
    let e = CpuQwen3Tp::split(&base, 4, KvDtype::F32).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("--tensor-parallel 4") && e.contains("2 KV heads"), "{e}");
}

#[test]
fn speculative_decoding_over_split_targets_is_lossless() {
    let mut cases = 0;
    for seed in 0..12u64 {
        let vocab = 6 + (seed as usize * 5) % 20;
        let cfg = target_config(vocab, 64, 2, 8, 4, 16, 96);
        let w = target_weights(seed ^ 0x77, &cfg);
        let spec = DraftSpec {
            layers: 1,
            block_size: 2 + (seed as usize % 6),
            target_layer_ids: vec![0, 1],
            markov_rank: 4,
            markov_kind: MarkovKind::Vanilla,
            confidence_head: seed % 2 == 0,
            confidence_with_markov: false,
        };
        let mut rng = Rng(seed);
        let prompt: Vec<u32> = (0..1 + rng.below(10)).map(|_| rng.below(vocab) as u32).collect();
        let opts = GenerateOptions { max_tokens: 10 + rng.below(30), eos_token_ids: vec![], logprobs: None };
        for n in [1, 2, 4] {
            let mut t = CpuQwen3Tp::new(cfg.clone(), &w, n, KvDtype::F32).unwrap();
            let plain = greedy(&mut t, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap();
            for verify in [VerifyLen::Fixed(spec.block_size), VerifyLen::Fixed(1 + rng.below(spec.block_size))] {
                let mut t = CpuQwen3Tp::new(cfg.clone(), &w, n, KvDtype::F32).unwrap();
                let mut d = random_draft(seed ^ 0xD5, &cfg, &w, &spec);
                let spec_out =
                    speculative(&mut t, &mut d, &prompt, &opts, &verify, |_| ControlFlow::Continue(())).unwrap();
                assert_eq!(spec_out.tokens, plain.tokens, "seed {seed}, N = {n}, {verify:?}");
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 72);
}
