//! The checkpoint readers' fuzz entry: one input drives every reader a user's folder reaches
//! before any weight is on a device — the safetensors header parser, the shard index's
//! `weight_map`, the Qwen3 config (with its FP8 `quantization_config`), the DSpark draft config
//! checked against it, and the CPU loaders that check every tensor's name, shape and dtype
//! against the configs (the FP8 scales included).
//!
//! The input is up to five parts split at [`SEPARATOR`]: the target's safetensors bytes, its
//! `config.json`, the draft's `config.json`, a `model.safetensors.index.json`, the draft's
//! safetensors bytes. Any result is
//! fine — readers answer bad input with an [`Error`](crate::Error) — but a panic, a hang or an
//! allocation the input did not pay for is a bug. Run by `fuzz/` (cargo-fuzz, coverage-guided,
//! `cargo xtask fuzz`) and, as a smoke run over mutated seeds, by the plain test
//! `tests/fuzz_smoke.rs`; [`seeds`] builds the corpus from the fixtures.

use crate::checkpoint::draft_config::DraftConfig;
use crate::checkpoint::json::JsonObject;
use crate::checkpoint::safetensors::{index_entries, Checkpoint};
use crate::checkpoint::shared_heads::SharedHeads;
use crate::cpu::dspark::{check_tensors, DraftWeights};
use crate::cpu::qwen3::Qwen3Weights;
use crate::Qwen3Config;
use std::path::Path;

/// Splits an input into its parts.
pub const SEPARATOR: &[u8] = b"\n--dspark-fuzz-part--\n";

/// Runs every reader on `data` (see the module header); returns how many of them accepted
/// their part (for the smoke test's coverage check).
pub fn read_all(data: &[u8]) -> usize {
    let parts = split(data);
    let part = |i: usize| parts.get(i).copied().unwrap_or(&[]);
    let text = |i: usize| std::str::from_utf8(part(i)).ok();
    let mut ok = 0;
    let ck = Checkpoint::from_bytes("fuzz/model.safetensors", part(0).to_vec()).ok();
    let dck = Checkpoint::from_bytes("fuzz/draft.safetensors", part(4).to_vec()).ok();
    let json = |i: usize| text(i).and_then(|t| JsonObject::parse(Path::new("fuzz/config.json"), t).ok());
    let target = json(1).and_then(|j| Qwen3Config::from_target_json(&j).ok());
    let draft = json(2).and_then(|j| DraftConfig::from_json(&j).ok());
    if let Some(j) = json(3) {
        ok += usize::from(index_entries(&j).is_ok());
    }
    ok += usize::from(ck.is_some()) + usize::from(target.is_some()) + usize::from(draft.is_some());
    ok += usize::from(dck.is_some());
    let (Some(ck), Some(cfg)) = (ck, target) else { return ok };
    let Ok(weights) = Qwen3Weights::load(&cfg, &ck) else { return ok };
    ok += 1;
    let (Some(dcfg), Some(dck)) = (draft, dck) else { return ok };
    if dcfg.validate_against(&cfg).is_err() || check_tensors(&dcfg, &dck).is_err() {
        return ok;
    }
    let shared = SharedHeads::find(&dck, &ck, cfg.tie_word_embeddings, [cfg.vocab_size, cfg.hidden_size]);
    ok + usize::from(DraftWeights::load_sharing(&dcfg, &dck, &weights, shared).is_ok())
}

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while parts.len() < 4 {
        match rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(i) => {
                parts.push(&rest[..i]);
                rest = &rest[i + SEPARATOR.len()..];
            }
            None => break,
        }
    }
    parts.push(rest);
    parts
}

/// Joins parts into one input.
pub fn join(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(SEPARATOR);
        }
        out.extend_from_slice(p);
    }
    out
}

/// The seed corpus: tiny random targets written as checkpoints by [`crate::testing`] (f32,
/// bf16, tied, FP8 with 4 × 4 blocks), each with a draft config that fits it and the draft's own
/// tensors (Markov variants and a confidence head), plus the sharded fixture's index — a few KB
/// each, so mutations stay fast. `fixtures` is the repository's fixtures folder; the folders
/// are written under `scratch`.
pub fn seeds(fixtures: &Path, scratch: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    use crate::checkpoint::draft_config::MarkovKind;
    use crate::testing::{
        draft_config, random_draft, target_config, target_weights, write_draft_dir, write_fp8_target_dir,
        write_target_dir, write_target_dir_as, DraftSpec,
    };
    use dspark_tensor::DType;
    let read = |p: &Path| std::fs::read(p);
    let mut out = Vec::new();
    for (i, (tied, kind)) in
        [(false, MarkovKind::Vanilla), (true, MarkovKind::Rnn), (false, MarkovKind::Gated)].into_iter().enumerate()
    {
        let mut cfg = target_config(16, 8, 2, 2, 1, 4, 32);
        cfg.tie_word_embeddings = tied;
        let w = target_weights(i as u64, &cfg);
        let spec = DraftSpec {
            layers: 1,
            block_size: 3,
            target_layer_ids: vec![0],
            markov_rank: 4,
            markov_kind: kind,
            confidence_head: i != 1,
            confidence_with_markov: i == 2,
        };
        let (t, d) = (scratch.join(format!("t{i}")), scratch.join(format!("d{i}")));
        std::fs::create_dir_all(&t)?;
        std::fs::create_dir_all(&d)?;
        match i {
            0 => write_target_dir(&t, &cfg, &w)?,
            _ => write_target_dir_as(&t, &cfg, &w, DType::BF16)?,
        }
        let draft = random_draft(i as u64 + 7, &cfg, &w, &spec);
        write_draft_dir(&d, &draft_config(&cfg, &spec), draft.weights())?;
        let (tcfg, dcfg) = (read(&t.join("config.json"))?, read(&d.join("config.json"))?);
        let (tst, dst) = (read(&t.join("model.safetensors"))?, read(&d.join("model.safetensors"))?);
        out.push(join(&[&tst, &tcfg, &dcfg, b"", &dst]));
    }
    let cfg = target_config(16, 8, 1, 2, 1, 4, 32);
    let f = scratch.join("fp8");
    std::fs::create_dir_all(&f)?;
    write_fp8_target_dir(&f, &cfg, &target_weights(9, &cfg), [4, 4])?;
    out.push(join(&[&read(&f.join("model.safetensors"))?, &read(&f.join("config.json"))?, b"", b""]));
    let index = read(&fixtures.join("qwen3-tiny-sharded/model.safetensors.index.json"))?;
    out.push(join(&[b"", b"", b"", &index]));
    Ok(out)
}
