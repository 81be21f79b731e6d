//! Mean accepted length of speculative sampling on the embedded demo pair (fixtures/coder-target
//! with fixtures/coder-draft) for both draft laws, at temperature 0.7 and 1.0 (filters off) and
//! at Qwen's recommended non-thinking settings (0.7, top-k 20, top-p 0.8): the 12 held-out
//! prompts of train/heldout_prompts.json, 64 tokens each, verify 7, seeds 0..SEEDS per prompt,
//! pooled as in coder_acceptance.rs. Prints a table; the default law (`DraftLaw::default()`) is
//! the one this measured better. Ignored (about a minute in release on 2 cores): run by name,
//! `cargo test -p dspark-spec --release --test sampled_acceptance -- --ignored --nocapture`.

use dspark_model::checkpoint::tokenizer::{eos_ids, Tokenizer};
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::TargetModel;
use dspark_spec::sampler::SamplingParams;
use dspark_spec::{speculative_sampled, DraftLaw, GenerateOptions, VerifyLen};
use std::ops::ControlFlow;
use std::path::PathBuf;

const SEEDS: u64 = 3;

#[test]
#[ignore]
fn demo_acceptance_by_draft_law() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tdir = root.join("fixtures/coder-target");
    let mut target = CpuQwen3::load(&tdir).unwrap();
    let mut draft = CpuDraft::load(&root.join("fixtures/coder-draft"), target.config(), target.weights()).unwrap();
    let tok = Tokenizer::from_dir(&tdir).unwrap().expect("the demo target ships a tokenizer");
    let prompts: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(root.join("train/heldout_prompts.json")).unwrap()).unwrap();
    let opts = GenerateOptions {
        max_tokens: 64,
        eos_token_ids: eos_ids(&tdir, &target.config().eos_token_ids).unwrap(),
        logprobs: None,
    };
    let settings = [(0.7f32, 0usize, 1.0f32), (1.0, 0, 1.0), (0.7, 20, 0.8)];
    let mut table = Vec::new();
    for &(temperature, top_k, top_p) in &settings {
        let mut row = Vec::new();
        for law in [DraftLaw::Greedy, DraftLaw::Sampled] {
            let (mut tokens, mut rounds) = (0usize, 0usize);
            for p in &prompts {
                let ids = tok.encode(p).unwrap();
                for seed in 0..SEEDS {
                    let params = SamplingParams { temperature, top_k, top_p, min_p: 0.0, seed };
                    let g = speculative_sampled(
                        &mut target,
                        &mut draft,
                        &ids,
                        &opts,
                        &VerifyLen::Fixed(7),
                        &params,
                        law,
                        |_| ControlFlow::Continue(()),
                    )
                    .unwrap();
                    let stats = g.spec.unwrap();
                    rounds += stats.rounds();
                    tokens += stats.accepted.iter().map(|m| m + 1).sum::<usize>();
                }
            }
            row.push((law, tokens as f64 / rounds as f64, rounds));
        }
        table.push(((temperature, top_k, top_p), row));
    }
    eprintln!("| T | top-k | top-p | greedy law τ (rounds) | sampled law τ (rounds) |");
    eprintln!("|---|---|---|---|---|");
    for ((t, k, p), row) in &table {
        eprintln!("| {t} | {k} | {p} | {:.3} ({}) | {:.3} ({}) |", row[0].1, row[0].2, row[1].1, row[1].2);
    }
}
