//! Random tiny models for property tests (no files), beside the shared [`Rng`] and [`rel_err`]
//! (re-exported from `dspark-testkit`).
//!
//! The lossless property has to hold for *every* target/draft pair, so the tests draw pairs
//! here: small geometry, weights with a standard deviation near the fixtures' 0.3 so logits
//! are peaked rather than flat, RMSNorm weights near 1, and drafts that share the target's
//! embedding and output head as the published drafts do. Small vocabularies make draft and
//! target agree often enough that accepted, partly accepted and rejected rounds all occur.

use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::draft_config::{DraftConfig, MarkovKind, Packaging};
use crate::cpu::dspark::{CpuDraft, DraftWeights};
use crate::cpu::markov::{ConfidenceHead, MarkovHead, MarkovVariant};
use crate::cpu::qwen3::{CpuQwen3, LayerWeights, Qwen3Weights};
pub use dspark_tensor::DType;
/// The seeded SplitMix64 generator and the relative-error check, from the bottom crate
/// `dspark-testkit`, so crates above this one import everything their tests need from here.
pub use dspark_testkit::{rel_err, repo_root, Rng};
use std::path::PathBuf;

/// A Qwen3 config with the given geometry (rope θ 1e4, eps 1e-6, untied).
pub fn target_config(
    vocab: usize,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    max_pos: usize,
) -> Qwen3Config {
    Qwen3Config {
        architecture: Some("Qwen3ForCausalLM".into()),
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: 2 * hidden + 8,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        max_position_embeddings: max_pos,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        declared_dtype: None,
        quantization: None,
    }
}

fn layer(rng: &mut Rng, c: &Qwen3Config, std: f32) -> LayerWeights {
    let (h, i, q, kv, hd) = (c.hidden_size, c.intermediate_size, c.q_dim(), c.kv_dim(), c.head_dim);
    LayerWeights {
        input_layernorm: rng.norm(h),
        q_proj: rng.normal_vec(q * h, std),
        k_proj: rng.normal_vec(kv * h, std),
        v_proj: rng.normal_vec(kv * h, std),
        o_proj: rng.normal_vec(h * q, std),
        q_norm: rng.norm(hd),
        k_norm: rng.norm(hd),
        post_attention_layernorm: rng.norm(h),
        gate_proj: rng.normal_vec(i * h, std),
        up_proj: rng.normal_vec(i * h, std),
        down_proj: rng.normal_vec(h * i, std),
    }
}

/// Random target weights for `cfg`.
pub fn target_weights(seed: u64, cfg: &Qwen3Config) -> Qwen3Weights {
    let mut rng = Rng(seed);
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    Qwen3Weights {
        embed_tokens: rng.normal_vec(v * h, 0.5).into(),
        layers: (0..cfg.num_hidden_layers).map(|_| layer(&mut rng, cfg, 0.3)).collect(),
        norm: rng.norm(h),
        lm_head: if cfg.tie_word_embeddings { None } else { Some(rng.normal_vec(v * h, 0.5).into()) },
    }
}

pub fn random_target(seed: u64, cfg: &Qwen3Config) -> CpuQwen3 {
    CpuQwen3::new(cfg.clone(), target_weights(seed, cfg))
}

/// The draft keys of a random draft.
#[derive(Clone, Debug)]
pub struct DraftSpec {
    pub layers: usize,
    pub block_size: usize,
    pub target_layer_ids: Vec<usize>,
    pub markov_rank: usize,
    pub markov_kind: MarkovKind,
    pub confidence_head: bool,
    pub confidence_with_markov: bool,
}

/// A draft config for `target` with the given keys (mask token = last vocabulary row).
pub fn draft_config(target: &Qwen3Config, spec: &DraftSpec) -> DraftConfig {
    let mut layer = target.clone();
    layer.num_hidden_layers = spec.layers;
    DraftConfig {
        path: PathBuf::from("<random draft>/config.json"),
        packaging: Packaging::Native,
        layer,
        block_size: spec.block_size,
        mask_token_id: target.vocab_size as u32 - 1,
        target_layer_ids: spec.target_layer_ids.clone(),
        num_target_layers: Some(target.num_hidden_layers),
        markov_rank: spec.markov_rank,
        markov_kind: spec.markov_kind,
        confidence_head: spec.confidence_head,
        confidence_with_markov: spec.confidence_head && spec.confidence_with_markov,
    }
}

/// A random draft sharing `target`'s embedding and output head.
pub fn random_draft(seed: u64, target_cfg: &Qwen3Config, target: &Qwen3Weights, spec: &DraftSpec) -> CpuDraft {
    let cfg = draft_config(target_cfg, spec);
    let mut rng = Rng(seed);
    let (h, v, r) = (target_cfg.hidden_size, target_cfg.vocab_size, spec.markov_rank);
    let markov = (r > 0).then(|| MarkovHead {
        rank: r,
        w1: rng.normal_vec(v * r, 0.5),
        w2: rng.normal_vec(v * r, 0.5),
        variant: match spec.markov_kind {
            MarkovKind::Vanilla => MarkovVariant::Vanilla,
            MarkovKind::Gated => {
                MarkovVariant::Gated { weight: rng.normal_vec(r * (h + r), 0.3), bias: rng.normal_vec(r, 0.3) }
            }
            MarkovKind::Rnn => MarkovVariant::Rnn {
                weight: rng.normal_vec(3 * r * (2 * r + h), 0.3),
                bias: rng.normal_vec(3 * r, 0.3),
            },
        },
    });
    let confidence = spec.confidence_head.then(|| ConfidenceHead {
        weight: rng.normal_vec(cfg.confidence_in(), 0.3),
        bias: rng.normal(0.5),
        with_markov: cfg.confidence_with_markov,
    });
    let w = DraftWeights {
        embed_tokens: target.embed_tokens.clone(),
        lm_head: target.head().clone(),
        shared: Default::default(),
        fc: rng.normal_vec(h * cfg.num_taps() * h, 0.3),
        hidden_norm: rng.norm(h),
        layers: (0..spec.layers).map(|_| layer(&mut rng, &cfg.layer, 0.3)).collect(),
        norm: rng.norm(h),
        markov,
        confidence,
    };
    CpuDraft::new(cfg, w)
}

/// Writes a random target as an HF folder (config.json + f32 model.safetensors), so the CUDA
/// backend, which loads from files, can run the same model as the CPU reference.
pub fn write_target_dir(dir: &std::path::Path, cfg: &Qwen3Config, w: &Qwen3Weights) -> std::io::Result<()> {
    write_target_dir_as(dir, cfg, w, DType::F32)
}

/// [`write_target_dir`] with every tensor stored as `dtype` (rounded to nearest even): a bf16
/// folder takes the CUDA backend's tensor-core path. Load the CPU reference from the folder too,
/// so both see the rounded weights.
pub fn write_target_dir_as(
    dir: &std::path::Path,
    cfg: &Qwen3Config,
    w: &Qwen3Weights,
    dtype: DType,
) -> std::io::Result<()> {
    let config = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let mut t: Vec<(String, Vec<usize>, &[f32])> = Vec::new();
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    t.push(("model.embed_tokens.weight".into(), vec![v, h], &w.embed_tokens));
    for (l, lw) in w.layers.iter().enumerate() {
        push_layer(&mut t, cfg, lw, &format!("model.layers.{l}."));
    }
    t.push(("model.norm.weight".into(), vec![h], &w.norm));
    if let Some(head) = &w.lm_head {
        t.push(("lm_head.weight".into(), vec![v, h], head));
    }
    write_tensors(&dir.join("model.safetensors"), &t, dtype)
}

/// Writes `w` as an FP8 checkpoint in Qwen's layout (`checkpoint::fp8`): every decoder
/// projection quantized per `block` (scale = amax / 448, stored as bf16 and used rounded), the
/// rest bf16, `quantization_config` in config.json. Returns the weights the folder holds, as the
/// CPU reference reads them (dequantized projections, bf16-rounded rest), for exact comparisons.
pub fn write_fp8_target_dir(
    dir: &std::path::Path,
    cfg: &Qwen3Config,
    w: &Qwen3Weights,
    block: [usize; 2],
) -> std::io::Result<Qwen3Weights> {
    use crate::checkpoint::fp8::{dequantize, quantize_blocks, quantize_with, F8_E4M3};
    write_target_dir_as(dir, cfg, w, DType::BF16)?;
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    config["quantization_config"] = serde_json::json!({
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": block,
    });
    std::fs::write(&path, config.to_string())?;
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| f32::from_bits((bf16_bits(x) as u32) << 16)).collect() };
    let mut held = Qwen3Weights {
        embed_tokens: round(&w.embed_tokens).into(),
        layers: Vec::new(),
        norm: round(&w.norm),
        lm_head: w.lm_head.as_deref().map(|x| round(x).into()),
    };
    let mut t: Vec<(String, String, Vec<usize>, Vec<u8>)> = Vec::new();
    let bf = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|&x| bf16_bits(x).to_le_bytes()).collect() };
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    t.push(("model.embed_tokens.weight".into(), "BF16".into(), vec![v, h], bf(&w.embed_tokens)));
    for (l, lw) in w.layers.iter().enumerate() {
        let prefix = format!("model.layers.{l}.");
        let mut plain = Vec::new();
        push_layer(&mut plain, cfg, lw, &prefix);
        let mut out = lw.clone();
        for norm in [&mut out.input_layernorm, &mut out.q_norm, &mut out.k_norm, &mut out.post_attention_layernorm] {
            *norm = round(norm);
        }
        for (name, shape, data) in plain {
            if !name.ends_with("_proj.weight") {
                t.push((name, "BF16".into(), shape, bf(data)));
                continue;
            }
            let (n, k) = (shape[0], shape[1]);
            let (_, scales) = quantize_blocks(data, (n, k), block);
            let scales = round(&scales);
            let (bytes, scales) = quantize_with(data, (n, k), block, scales);
            let sk = k.div_ceil(block[1]);
            let deq = dequantize(&bytes, &scales, (n, k), block);
            let field = name.trim_start_matches(&prefix).to_string();
            *out.linear_mut(&field).ok_or_else(|| std::io::Error::other(format!("no field {field}")))? = deq;
            t.push((format!("{name}_scale_inv"), "BF16".into(), vec![n.div_ceil(block[0]), sk], bf(&scales)));
            t.push((name, F8_E4M3.into(), shape, bytes));
        }
        held.layers.push(out);
    }
    t.push(("model.norm.weight".into(), "BF16".into(), vec![h], bf(&w.norm)));
    if let Some(head) = &w.lm_head {
        t.push(("lm_head.weight".into(), "BF16".into(), vec![v, h], bf(head)));
    }
    let named: Vec<(&str, &str, Vec<usize>, Vec<u8>)> =
        t.iter().map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.clone(), b.clone())).collect();
    std::fs::write(dir.join("model.safetensors"), crate::checkpoint::safetensors::serialize_named(&named))?;
    Ok(held)
}

/// Writes a random draft in the DeepSpec native format (without embed/lm_head: borrowed).
pub fn write_draft_dir(dir: &std::path::Path, cfg: &DraftConfig, w: &DraftWeights) -> std::io::Result<()> {
    write_draft_dir_as(dir, cfg, w, DType::F32)
}

/// [`write_draft_dir`] with every tensor stored as `dtype` (see [`write_target_dir_as`]).
pub fn write_draft_dir_as(
    dir: &std::path::Path,
    cfg: &DraftConfig,
    w: &DraftWeights,
    dtype: DType,
) -> std::io::Result<()> {
    let l = &cfg.layer;
    let config = serde_json::json!({
        "architectures": ["Qwen3DSparkModel"],
        "vocab_size": l.vocab_size, "hidden_size": l.hidden_size, "intermediate_size": l.intermediate_size,
        "num_hidden_layers": l.num_hidden_layers, "num_attention_heads": l.num_attention_heads,
        "num_key_value_heads": l.num_key_value_heads, "head_dim": l.head_dim, "rms_norm_eps": l.rms_norm_eps,
        "rope_theta": l.rope_theta, "max_position_embeddings": l.max_position_embeddings,
        "block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id, "target_layer_ids": cfg.target_layer_ids,
        "markov_rank": cfg.markov_rank,
        "markov_head_type": match cfg.markov_kind { MarkovKind::Vanilla => "vanilla", MarkovKind::Gated => "gated", MarkovKind::Rnn => "rnn" },
        "enable_confidence_head": cfg.confidence_head, "confidence_head_with_markov": cfg.confidence_with_markov,
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    let (h, r) = (l.hidden_size, cfg.markov_rank);
    let mut t: Vec<(String, Vec<usize>, &[f32])> = vec![
        ("fc.weight".into(), vec![h, cfg.num_taps() * h], &w.fc),
        ("hidden_norm.weight".into(), vec![h], &w.hidden_norm),
        ("norm.weight".into(), vec![h], &w.norm),
    ];
    for (i, lw) in w.layers.iter().enumerate() {
        push_layer(&mut t, l, lw, &format!("layers.{i}."));
    }
    let bias_store;
    if let Some(m) = &w.markov {
        t.push(("markov_head.markov_w1.weight".into(), vec![l.vocab_size, r], &m.w1));
        t.push(("markov_head.markov_w2.weight".into(), vec![l.vocab_size, r], &m.w2));
        match &m.variant {
            MarkovVariant::Vanilla => {}
            MarkovVariant::Gated { weight, bias } => {
                t.push(("markov_head.gate_proj.weight".into(), vec![r, h + r], weight));
                t.push(("markov_head.gate_proj.bias".into(), vec![r], bias));
            }
            MarkovVariant::Rnn { weight, bias } => {
                t.push(("markov_head.joint_proj.weight".into(), vec![3 * r, 2 * r + h], weight));
                t.push(("markov_head.joint_proj.bias".into(), vec![3 * r], bias));
            }
        }
    }
    if let Some(c) = &w.confidence {
        bias_store = [c.bias];
        t.push(("confidence_head.proj.weight".into(), vec![1, cfg.confidence_in()], &c.weight));
        t.push(("confidence_head.proj.bias".into(), vec![1], &bias_store));
    }
    write_tensors(&dir.join("model.safetensors"), &t, dtype)
}

fn push_layer<'a>(t: &mut Vec<(String, Vec<usize>, &'a [f32])>, cfg: &Qwen3Config, lw: &'a LayerWeights, prefix: &str) {
    let tensors: [&'a [f32]; 11] = [
        &lw.input_layernorm,
        &lw.q_proj,
        &lw.k_proj,
        &lw.v_proj,
        &lw.o_proj,
        &lw.q_norm,
        &lw.k_norm,
        &lw.post_attention_layernorm,
        &lw.gate_proj,
        &lw.up_proj,
        &lw.down_proj,
    ];
    for ((name, shape), data) in crate::cpu::qwen3::layer_tensors(cfg).into_iter().zip(tensors) {
        t.push((format!("{prefix}{name}"), shape, data));
    }
}

fn write_tensors(path: &std::path::Path, t: &[(String, Vec<usize>, &[f32])], dtype: DType) -> std::io::Result<()> {
    let encode = |x: f32| -> Vec<u8> {
        match dtype {
            DType::BF16 => bf16_bits(x).to_le_bytes().to_vec(),
            _ => x.to_le_bytes().to_vec(),
        }
    };
    if dtype == DType::F16 {
        return Err(std::io::Error::other("test folders are written as f32 or bf16"));
    }
    let owned: Vec<(&str, DType, Vec<usize>, Vec<u8>)> =
        t.iter().map(|(n, s, d)| (n.as_str(), dtype, s.clone(), d.iter().flat_map(|&x| encode(x)).collect())).collect();
    std::fs::write(path, crate::checkpoint::safetensors::serialize(&owned))
}

/// The bf16 nearest to a finite `x` (ties to even): the top half of its f32 bits, rounded.
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::bf16_bits;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        let mut rng = super::Rng(3);
        let mut values = rng.normal_vec(10_000, 1.0);
        // Exact halfway cases: ties go to the even bf16.
        values.extend([f32::from_bits(0x3F80_8000), f32::from_bits(0x3F81_8000), 0.0, -0.0, 1.0, -2.5]);
        for x in values {
            assert_eq!(bf16_bits(x), half::bf16::from_f32(x).to_bits(), "{x}");
        }
    }
}
