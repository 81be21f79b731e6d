//! Every way a draft can fail to fit its target, or its own config, is a clear error naming
//! the file and the field or tensor — never a silently useless draft (DSPARK.md §1.7).

mod common;

use common::fixture;
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::TargetModel;
use dspark_testkit::files::{copy_files, edit_json, edit_safetensors_header};
use serde_json::{json, Value};
use std::path::Path;

fn copy_dir(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_files(&fixture(name), tmp.path());
    tmp
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    edit_json(&dir.join("config.json"), |v| edit(v.as_object_mut().unwrap()));
}

fn edit_header(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    edit_safetensors_header(&dir.join("model.safetensors"), |h| edit(h.as_object_mut().unwrap()));
}

fn load_err(draft: &Path) -> String {
    let target = CpuQwen3::load(&fixture("qwen3-tiny-f32")).unwrap();
    match CpuDraft::load(draft, target.config(), target.weights()) {
        Ok(_) => panic!("draft at {} loaded but should not", draft.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_names(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "error {e:?} does not mention {p:?}");
    }
}

#[test]
fn the_fixture_itself_loads() {
    let target = CpuQwen3::load(&fixture("qwen3-tiny-f32")).unwrap();
    CpuDraft::load(&fixture("dspark-tiny-vanilla"), target.config(), target.weights()).unwrap();
}

#[test]
fn wrong_architecture() {
    let d = copy_dir("dspark-tiny-vanilla");
    edit_config(d.path(), |c| {
        c.insert("architectures".into(), json!(["Qwen3ForCausalLM"]));
    });
    assert_names(&load_err(d.path()), &["config.json", "architectures", "Qwen3DSparkModel"]);
}

#[test]
fn geometry_must_match_the_target() {
    for (field, value) in [
        ("hidden_size", 32),
        ("vocab_size", 600),
        ("num_attention_heads", 2),
        ("num_key_value_heads", 1),
        ("head_dim", 16),
    ] {
        let d = copy_dir("dspark-tiny-vanilla");
        edit_config(d.path(), |c| {
            c.insert(field.into(), json!(value));
        });
        let e = load_err(d.path());
        assert_names(&e, &["config.json", field]);
    }
}

#[test]
fn target_layer_ids_must_increase_and_avoid_the_last_layer() {
    let d = copy_dir("dspark-tiny-vanilla");
    edit_config(d.path(), |c| {
        c.insert("target_layer_ids".into(), json!([2, 0]));
    });
    assert_names(&load_err(d.path()), &["target_layer_ids", "strictly increasing"]);
    edit_config(d.path(), |c| {
        c.insert("target_layer_ids".into(), json!([0, 3]));
    });
    assert_names(&load_err(d.path()), &["target_layer_ids", "layer 3", "last layer"]);
}

#[test]
fn fc_width_must_be_taps_times_hidden() {
    let d = copy_dir("dspark-tiny-vanilla");
    edit_config(d.path(), |c| {
        c.insert("target_layer_ids".into(), json!([0, 1, 2]));
    });
    assert_names(&load_err(d.path()), &["fc.weight", "[64, 128]", "[64, 192]"]);
}

#[test]
fn markov_tensors_iff_rank_positive() {
    let d = copy_dir("dspark-tiny-vanilla");
    edit_config(d.path(), |c| {
        c.insert("markov_rank".into(), json!(0));
    });
    assert_names(&load_err(d.path()), &["model.safetensors", "markov_head.markov_w", "unexpected", "markov_rank 0"]);
    let d = copy_dir("dflash-tiny");
    edit_config(d.path(), |c| {
        c.insert("markov_rank".into(), json!(16));
        c.insert("markov_head_type".into(), json!("vanilla"));
    });
    assert_names(&load_err(d.path()), &["markov_head.markov_w1.weight", "missing"]);
    let d = copy_dir("dspark-tiny-vanilla");
    edit_config(d.path(), |c| {
        c.insert("markov_head_type".into(), json!("gated"));
    });
    assert_names(&load_err(d.path()), &["markov_head.gate_proj.weight", "missing"]);
    edit_config(d.path(), |c| {
        c.insert("markov_head_type".into(), json!("lstm"));
    });
    assert_names(&load_err(d.path()), &["markov_head_type", "lstm"]);
}

#[test]
fn confidence_tensors_iff_enabled() {
    let d = copy_dir("dspark-tiny-vanilla");
    edit_config(d.path(), |c| {
        c.insert("enable_confidence_head".into(), json!(false));
    });
    assert_names(&load_err(d.path()), &["confidence_head.proj", "unexpected"]);
    let d = copy_dir("dflash-tiny");
    edit_config(d.path(), |c| {
        c.insert("enable_confidence_head".into(), json!(true));
    });
    assert_names(&load_err(d.path()), &["confidence_head.proj.weight", "missing"]);
}

#[test]
fn strict_names_refuse_a_partly_matching_draft() {
    let d = copy_dir("dspark-tiny-vanilla");
    edit_header(d.path(), |h| {
        let t = h.remove("layers.1.mlp.up_proj.weight").unwrap();
        h.insert("model.layers.1.mlp.up_proj.weight".into(), t);
    });
    assert_names(&load_err(d.path()), &["model.safetensors", "model.layers.1.mlp.up_proj.weight", "unexpected"]);
    let d = copy_dir("dspark-tiny-vanilla");
    edit_header(d.path(), |h| {
        h.remove("layers.0.self_attn.k_norm.weight");
    });
    assert_names(&load_err(d.path()), &["layers.0.self_attn.k_norm.weight", "missing"]);
}

#[test]
fn missing_draft_keys() {
    for key in ["block_size", "mask_token_id", "target_layer_ids"] {
        let d = copy_dir("dspark-tiny-vanilla");
        edit_config(d.path(), |c| {
            c.remove(key);
        });
        assert_names(&load_err(d.path()), &["config.json", key, "missing"]);
    }
}

#[test]
fn copies_of_the_target_s_matrices_are_shared_and_draft_the_same() {
    use dspark_model::checkpoint::draft_config::DraftConfig;
    use dspark_model::checkpoint::safetensors::Checkpoint;
    use dspark_model::checkpoint::shared_heads::SharedHeads;
    use dspark_model::cpu::dspark::DraftWeights;
    use dspark_model::Drafter;
    use std::sync::Arc;
    // dspark-tiny-vanilla carries f32 copies of qwen3-tiny-f32's embed_tokens and lm_head, as
    // a published DSpark draft carries its target's.
    let target = CpuQwen3::load(&fixture("qwen3-tiny-f32")).unwrap();
    let (dir, tdir) = (fixture("dspark-tiny-vanilla"), fixture("qwen3-tiny-f32"));
    let (ck, tck) = (Checkpoint::open_dir(&dir).unwrap(), Checkpoint::open_dir(&tdir).unwrap());
    let cfg = DraftConfig::from_dir(&dir).unwrap();
    let shared = SharedHeads::find(&ck, &tck, false, [512, 64]);
    assert_eq!(shared, SharedHeads { embed_tokens: true, lm_head: true });
    let w = DraftWeights::load_sharing(&cfg, &ck, target.weights(), shared).unwrap();
    assert!(Arc::ptr_eq(&w.embed_tokens, &target.weights().embed_tokens), "embed_tokens is a copy");
    assert!(Arc::ptr_eq(&w.lm_head, target.weights().head()), "lm_head is a copy");
    // Loaded without sharing, the draft holds its own copies — of the same values.
    let own = DraftWeights::load(&cfg, &ck, target.weights()).unwrap();
    assert!(!Arc::ptr_eq(&own.embed_tokens, &target.weights().embed_tokens));
    assert_eq!(own.embed_tokens, w.embed_tokens);
    let (mut a, mut b) = (CpuDraft::new(cfg.clone(), w), CpuDraft::new(cfg, own));
    assert_eq!(a.shared_with_target(), 2 * 512 * 64 * 4, "the memory saved");
    assert_eq!(b.shared_with_target(), 0);
    let h = target.config().hidden_size;
    let features: Vec<f32> =
        (0..3 * a.target_layer_ids().len() * h).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
    a.append_context(&features).unwrap();
    b.append_context(&features).unwrap();
    for anchor in [0u32, 7, 300, 511] {
        assert_eq!(a.propose(anchor).unwrap(), b.propose(anchor).unwrap(), "anchor {anchor}");
    }
}
