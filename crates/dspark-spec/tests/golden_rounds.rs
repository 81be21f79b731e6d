//! DSpark rounds against the reference (nemo-automodel's port of DeepSpec's
//! `Qwen3DSparkModel`, driven by `fixtures/gen/make_draft_fixtures.py`).
//!
//! A checking wrapper sits between the speculative loop and the CPU draft. Every round it
//! compares what the loop hands the draft (the tapped target features of the newly committed
//! positions) and what the draft computes (block hidden after the final norm, base logits,
//! Markov-biased logits, confidence logits) with the golden tensors at 1e-4 relative
//! (max |Δ| / max |reference|), and the anchor, position and draft tokens exactly. The whole run
//! must then reproduce the reference's tokens and accepted lengths exactly (up to a final round
//! that our loop caps at the tokens still wanted).

use dspark_model::checkpoint::safetensors::Checkpoint;
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::testing::rel_err;
use dspark_model::{Drafter, Proposal, Result, TargetModel};
use dspark_spec::{speculative, GenerateOptions, VerifyLen};
use serde_json::Value;
use std::ops::ControlFlow;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

struct Checked {
    name: String,
    inner: CpuDraft,
    json: Value,
    tensors: Checkpoint,
    round: usize,
    /// Rounds whose tensors were compared (for the final sanity check).
    compared: usize,
}

impl Checked {
    fn golden(&self, what: &str) -> Option<Vec<f32>> {
        let name = format!("round{}.{what}", self.round);
        let shape = self.tensors.tensors.get(&name)?.shape.clone();
        Some(self.tensors.f32(&name, &shape).expect("golden tensor"))
    }

    fn close(&self, what: &str, got: &[f32]) {
        if let Some(want) = self.golden(what) {
            let e = rel_err(got, &want);
            assert!(e <= 1e-4, "{} round {}: {what} rel err {e}", self.name, self.round);
        }
    }
}

impl Drafter for Checked {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn target_layer_ids(&self) -> &[usize] {
        self.inner.target_layer_ids()
    }
    fn context_len(&self) -> usize {
        self.inner.context_len()
    }
    fn reset(&mut self) {
        self.inner.reset();
        self.round = 0;
    }
    fn append_context(&mut self, features: &[f32]) -> Result<()> {
        let r = &self.json["rounds"][self.round];
        if !r.is_null() {
            let range = ids(&r["context_positions"]);
            assert_eq!(
                self.inner.context_len(),
                range[0] as usize,
                "{} round {}: context start",
                self.name,
                self.round
            );
            let row = features.len() / (range[1] - range[0]) as usize;
            assert_eq!(features.len(), row * (range[1] - range[0]) as usize);
        }
        self.close("context_features", features);
        self.inner.append_context(features)
    }
    fn propose(&mut self, anchor: u32) -> Result<Proposal> {
        let r = self.json["rounds"][self.round].clone();
        let (out, chain) = self.inner.propose_detailed(anchor)?;
        if !r.is_null() {
            assert_eq!(anchor as u64, r["anchor"].as_u64().unwrap(), "{} round {}: anchor", self.name, self.round);
            assert_eq!(
                self.inner.context_len() as u64,
                r["p"].as_u64().unwrap(),
                "{} round {}: p",
                self.name,
                self.round
            );
            if self.golden("block_hidden").is_some() {
                self.close("block_hidden", &out.hidden);
                self.close("base_logits", &out.base_logits);
                self.close("markov_logits", &chain.logits);
                if !chain.confidence_logits.is_empty() {
                    self.close("confidence_logits", &chain.confidence_logits);
                }
                self.compared += 1;
            }
            assert_eq!(chain.tokens, ids(&r["draft_tokens"]), "{} round {}: draft tokens", self.name, self.round);
        }
        self.round += 1;
        let mut p = Proposal { tokens: chain.tokens, survival: None };
        if !chain.confidence_logits.is_empty() {
            p.survival = Some(dspark_model::cpu::markov::prefix_survival(&chain.confidence_logits));
        }
        Ok(p)
    }
}

fn check_fixture(name: &str) {
    let text = std::fs::read_to_string(root().join(format!("fixtures/golden/{name}.json"))).expect("golden json");
    let json: Value = serde_json::from_str(&text).unwrap();
    let tensors_file = json["tensors_file"].as_str().map(str::to_string).unwrap_or(format!("{name}.safetensors"));
    let tensors = Checkpoint::open_files(&[root().join("fixtures/golden").join(tensors_file)]).unwrap();
    let target_dir = root().join("fixtures").join(json["target"].as_str().unwrap());
    let mut target = CpuQwen3::load(&target_dir).unwrap();
    let draft = CpuDraft::load(&root().join("fixtures").join(name), target.config(), target.weights())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let block = draft.block_size();
    let mut checked = Checked { name: name.into(), inner: draft, json: json.clone(), tensors, round: 0, compared: 0 };
    let opts = GenerateOptions {
        max_tokens: json["max_new_tokens"].as_u64().unwrap() as usize,
        eos_token_ids: ids(&json["eos_token_ids"]),
        logprobs: None,
    };
    let prompt = ids(&json["prompt_ids"]);
    let g =
        speculative(&mut target, &mut checked, &prompt, &opts, &VerifyLen::Fixed(block), |_| ControlFlow::Continue(()))
            .unwrap();
    assert_eq!(g.tokens, ids(&json["tokens"]), "{name}: tokens");
    assert_eq!(g.tokens, ids(&json["greedy_tokens"]), "{name}: tokens vs plain greedy");
    // The reference always verifies the whole block and cuts the output at max tokens; our loop
    // verifies no more drafts than tokens still wanted, so a final round may verify fewer.
    let stats = g.spec.unwrap();
    let want: Vec<usize> =
        ids(&json["accepted_lengths"]).into_iter().zip(&stats.verified).map(|(m, &k)| (m as usize).min(k)).collect();
    assert_eq!(stats.accepted.len(), want.len(), "{name}: rounds");
    assert_eq!(stats.accepted, want, "{name}: accepted lengths");
    assert!(checked.compared >= 1, "{name}: no round had golden tensors");
}

#[test]
fn vanilla() {
    check_fixture("dspark-tiny-vanilla");
}

#[test]
fn gated() {
    check_fixture("dspark-tiny-gated");
}

#[test]
fn rnn() {
    check_fixture("dspark-tiny-rnn");
}

#[test]
fn dflash_markov_rank_0() {
    check_fixture("dflash-tiny");
}

#[test]
fn block_size_4() {
    check_fixture("dspark-tiny-block4");
}

#[test]
fn copy_rig_accepts_every_draft() {
    check_fixture("dspark-tiny-copy");
}

#[test]
fn speculators_packaging_matches_native() {
    check_fixture("dspark-tiny-speculators");
}
