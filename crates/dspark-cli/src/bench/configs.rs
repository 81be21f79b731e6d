//! The shapes `dspark bench` builds: Qwen3-8B and the DSpark-8B draft, as the configs their
//! published checkpoints ship (`Qwen/Qwen3-8B`, `deepseek-ai/dspark_qwen3_8b_block7`), parsed by
//! the same code that reads a checkpoint folder. Weights are random (made on the device).

use dspark_model::checkpoint::draft_config::DraftConfig;
use dspark_model::checkpoint::json::JsonObject;
use dspark_model::{Qwen3Config, Result};
use std::path::Path;

pub const QWEN3_8B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "model_type": "qwen3",
  "hidden_size": 4096,
  "intermediate_size": 12288,
  "num_hidden_layers": 36,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "vocab_size": 151936,
  "max_position_embeddings": 40960,
  "rms_norm_eps": 1e-6,
  "rope_theta": 1000000,
  "tie_word_embeddings": false,
  "hidden_act": "silu",
  "torch_dtype": "bfloat16"
}"#;

pub const DSPARK_8B: &str = r#"{
  "architectures": ["Qwen3DSparkModel"],
  "model_type": "qwen3",
  "block_size": 7,
  "hidden_size": 4096,
  "intermediate_size": 12288,
  "num_hidden_layers": 5,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "vocab_size": 151936,
  "max_position_embeddings": 40960,
  "rms_norm_eps": 1e-6,
  "rope_theta": 1000000,
  "tie_word_embeddings": false,
  "hidden_act": "silu",
  "num_target_layers": 36,
  "target_layer_ids": [1, 9, 17, 25, 33],
  "mask_token_id": 151669,
  "markov_rank": 256,
  "markov_head_type": "vanilla",
  "enable_confidence_head": true,
  "confidence_head_with_markov": true,
  "torch_dtype": "bfloat16"
}"#;

/// The Qwen3-8B target config.
pub fn qwen3_8b() -> Result<Qwen3Config> {
    Qwen3Config::from_json(&JsonObject::parse(Path::new("<built-in Qwen3-8B config>"), QWEN3_8B)?)
}

/// `Qwen/Qwen3-8B-FP8`'s quantization, as its config.json states it.
pub const QWEN3_8B_FP8_QUANT: &str = r#""quantization_config": {
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]
  }"#;

/// The Qwen3-8B-FP8 target config: Qwen3-8B's with [`QWEN3_8B_FP8_QUANT`], through the same reader.
pub fn qwen3_8b_fp8() -> Result<Qwen3Config> {
    let text = QWEN3_8B.replacen('{', &format!("{{\n  {QWEN3_8B_FP8_QUANT},"), 1);
    Qwen3Config::from_json(&JsonObject::parse(Path::new("<built-in Qwen3-8B-FP8 config>"), &text)?)
}

/// The DSpark-8B draft config.
pub fn dspark_8b() -> Result<DraftConfig> {
    DraftConfig::native(&JsonObject::parse(Path::new("<built-in DSpark-8B config>"), DSPARK_8B)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_configs_parse_and_pair() {
        let t = qwen3_8b().unwrap();
        let d = dspark_8b().unwrap();
        assert_eq!((t.num_hidden_layers, t.hidden_size, t.vocab_size), (36, 4096, 151936));
        assert_eq!((d.layer.num_hidden_layers, d.block_size, d.markov_rank), (5, 7, 256));
        assert_eq!(d.target_layer_ids, vec![1, 9, 17, 25, 33]);
        d.validate_against(&t).unwrap();
        let f = qwen3_8b_fp8().unwrap();
        assert_eq!(f.quantization.as_ref().map(|q| q.block), Some([128, 128]));
        assert_eq!(f.hidden_size, t.hidden_size);
        d.validate_against(&f).unwrap();
    }
}
