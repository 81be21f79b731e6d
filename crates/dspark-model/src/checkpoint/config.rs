//! `config.json` of a Qwen3 target (HF `Qwen3ForCausalLM` layout).
//!
//! Only fields that change the math are read; the rest (`max_window_layers`, `dtype`, …) are
//! reported by `dspark info` at most. Fields follow transformers' defaults where the file may
//! omit them: `num_key_value_heads` defaults to `num_attention_heads`, `head_dim` to
//! `hidden_size / num_attention_heads`, `rms_norm_eps` to 1e-6, `tie_word_embeddings` to
//! false (Qwen3Config's default). RoPE θ is read from transformers-5's
//! `rope_parameters.rope_theta`, else the older top-level `rope_theta`, else 1e6. Features the
//! engine does not implement (attention bias, sliding windows, RoPE scaling) are rejected with
//! the field's name rather than silently computed wrong.

use crate::checkpoint::json::JsonObject;
use crate::error::Result;
use std::path::Path;

/// The geometry and constants of a Qwen3 decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3Config {
    pub architecture: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The dtype the config declares (`dtype` in transformers 5, `torch_dtype` before).
    pub declared_dtype: Option<String>,
    /// FP8 block scaling of the decoder's linear layers (`quantization_config`), if any.
    pub quantization: Option<crate::checkpoint::fp8::Fp8Quant>,
}

impl Qwen3Config {
    /// Reads `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Qwen3Config> {
        Self::from_target_json(&JsonObject::read(&dir.join("config.json"))?)
    }

    /// [`Qwen3Config::from_json`] for a whole target model: its `model_type` and
    /// `architectures`, when given, must name Qwen3 (another model's config can parse as one
    /// and would load as the wrong network).
    pub fn from_target_json(j: &JsonObject) -> Result<Qwen3Config> {
        if let Some(t) = j.opt_str("model_type")? {
            if t != "qwen3" {
                return Err(j.err("model_type", format!("expected \"qwen3\", found {t:?}")));
            }
        }
        let c = Self::from_json(j)?;
        if let Some(a) = c.architecture.as_deref() {
            if a != "Qwen3ForCausalLM" {
                return Err(j.err("architectures", format!("expected [\"Qwen3ForCausalLM\"], found {a:?}")));
            }
        }
        Ok(c)
    }

    pub fn from_json(j: &JsonObject) -> Result<Qwen3Config> {
        let architecture = match j.get("architectures").and_then(|v| v.as_array()) {
            Some(a) => a.first().and_then(|v| v.as_str()).map(str::to_string),
            None => None,
        };
        let hidden_size = j.positive("hidden_size")?;
        let num_attention_heads = j.positive("num_attention_heads")?;
        let num_key_value_heads = j.opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(j.err(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads = {num_attention_heads}"),
            ));
        }
        let head_dim = match j.opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => return Err(j.err("head_dim", "missing, and hidden_size is not a multiple of num_attention_heads")),
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(j.err("head_dim", format!("must be a positive even number for RoPE, got {head_dim}")));
        }
        let rope_theta = rope_theta(j)?;
        if j.opt_bool("attention_bias")?.unwrap_or(false) {
            return Err(j.err("attention_bias", "true is not supported (Qwen3 has no attention bias)"));
        }
        if j.opt_bool("use_sliding_window")?.unwrap_or(false) {
            return Err(j.err("use_sliding_window", "true is not supported"));
        }
        if let Some(types) = j.get("layer_types").and_then(|v| v.as_array()) {
            if let Some(bad) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return Err(j.err("layer_types", format!("only \"full_attention\" layers are supported, got {bad}")));
            }
        }
        if let Some(act) = j.opt_str("hidden_act")? {
            if act != "silu" {
                return Err(j.err("hidden_act", format!("only \"silu\" is supported, got {act:?}")));
            }
        }
        let rms_norm_eps = j.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
        // Qwen3 ships 1e-6; an ε of 1 or more swamps the mean square and silently changes the
        // network (a config fuzz found 1e40 and 1e308 accepted).
        if rms_norm_eps.is_nan() || rms_norm_eps <= 0.0 || rms_norm_eps >= 1.0 {
            return Err(j.err("rms_norm_eps", format!("must be in (0, 1), got {rms_norm_eps}")));
        }
        // Never read quantized weights as if they were plain ones: FP8 block scaling is read,
        // anything else refused by its field.
        let quantization = match j.opt_object("quantization_config")? {
            Some(q) => Some(crate::checkpoint::fp8::Fp8Quant::from_json(&q)?),
            None => None,
        };
        let bos = j.id_list("bos_token_id")?;
        Ok(Qwen3Config {
            architecture,
            vocab_size: j.positive("vocab_size")?,
            hidden_size,
            intermediate_size: j.positive("intermediate_size")?,
            num_hidden_layers: j.positive("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            max_position_embeddings: j.positive("max_position_embeddings")?,
            tie_word_embeddings: j.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            bos_token_id: bos.first().copied(),
            eos_token_ids: j.id_list("eos_token_id")?,
            quantization,
            declared_dtype: match j.opt_str("dtype")? {
                Some(d) => Some(d.to_string()),
                None => j.opt_str("torch_dtype")?.map(str::to_string),
            },
        })
    }

    /// Width of the q projection output (`num_attention_heads · head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the k and v projection outputs (`num_key_value_heads · head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
}

/// θ from `rope_parameters` (transformers ≥ 5), `rope_theta` (older), or the Qwen3 default.
/// Any scaling type other than "default" is refused: the engine implements plain RoPE only.
fn rope_theta(j: &JsonObject) -> Result<f64> {
    let check_type = |o: &JsonObject, field: &str| -> Result<()> {
        match o.opt_str("rope_type")?.or(o.opt_str("type")?) {
            None | Some("default") => Ok(()),
            Some(t) => Err(j.err(field, format!("RoPE scaling type {t:?} is not supported"))),
        }
    };
    let theta = if let Some(p) = j.opt_object("rope_parameters")? {
        check_type(&p, "rope_parameters.rope_type")?;
        match p.opt_f64("rope_theta")? {
            Some(t) => Some(t),
            None => j.opt_f64("rope_theta")?,
        }
    } else {
        j.opt_f64("rope_theta")?
    };
    if let Some(s) = j.opt_object("rope_scaling")? {
        check_type(&s, "rope_scaling")?;
    }
    let theta = theta.unwrap_or(1e6);
    #[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(x > 0)` also refuses NaN
    if !(theta > 0.0) {
        return Err(j.err("rope_theta", format!("must be positive, got {theta}")));
    }
    Ok(theta)
}

/// A tied checkpoint (`tie_word_embeddings: true`) must not carry its own `lm_head.weight`:
/// the engine would ignore that tensor and use the embeddings, silently changing the output.
pub fn check_tied_head(cfg: &Qwen3Config, has_lm_head: bool) -> Result<()> {
    if cfg.tie_word_embeddings && has_lm_head {
        return Err(crate::error::Error::Request(
            "config.json has tie_word_embeddings: true but the checkpoint holds lm_head.weight, which would be \
             ignored; set tie_word_embeddings to false to use it, or remove the tensor"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Qwen3Config> {
        Qwen3Config::from_json(&JsonObject::parse(Path::new("config.json"), text)?)
    }

    const BASE: &str = r#""vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 32"#;

    #[test]
    fn defaults_follow_transformers() {
        let c = parse(&format!("{{{BASE}}}")).unwrap();
        assert_eq!((c.num_key_value_heads, c.head_dim, c.rope_theta), (2, 4, 1e6));
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn both_rope_spellings() {
        let a = parse(&format!(r#"{{{BASE}, "rope_parameters": {{"rope_theta": 5000.0, "rope_type": "default"}}}}"#))
            .unwrap();
        let b = parse(&format!(r#"{{{BASE}, "rope_theta": 5000}}"#)).unwrap();
        assert_eq!((a.rope_theta, b.rope_theta), (5000.0, 5000.0));
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse(r#"{"vocab_size": 10}"#).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("`hidden_size`"), "{e}");
        let e = parse(&format!(r#"{{{BASE}, "rope_parameters": {{"rope_theta": 1.0, "rope_type": "yarn"}}}}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rope_parameters.rope_type") && e.contains("yarn"), "{e}");
        let e = parse(&format!(r#"{{{BASE}, "num_key_value_heads": 3}}"#)).unwrap_err().to_string();
        assert!(e.contains("num_key_value_heads"), "{e}");
        let e = parse(&format!(r#"{{{BASE}, "eos_token_id": "x"}}"#)).unwrap_err().to_string();
        assert!(e.contains("eos_token_id"), "{e}");
        for eps in ["1e40", "1e308", "1.0", "0", "-1e-6"] {
            let e = parse(&format!(r#"{{{BASE}, "rms_norm_eps": {eps}}}"#)).unwrap_err().to_string();
            assert!(e.contains("rms_norm_eps"), "{eps}: {e}");
        }
        let e =
            parse(&format!(r#"{{{BASE}, "quantization_config": {{"quant_method": "awq"}}}}"#)).unwrap_err().to_string();
        assert!(e.contains("quantization_config.quant_method") && e.contains("awq"), "{e}");
    }

    fn parse_target(text: &str) -> Result<Qwen3Config> {
        Qwen3Config::from_target_json(&JsonObject::parse(Path::new("config.json"), text)?)
    }

    #[test]
    fn a_tied_head_beside_an_lm_head_tensor_is_refused() {
        let tied = parse(&format!(r#"{{{BASE}, "tie_word_embeddings": true}}"#)).unwrap();
        let e = check_tied_head(&tied, true).unwrap_err().to_string();
        assert!(e.contains("lm_head.weight") && e.contains("tie_word_embeddings"), "{e}");
        assert!(check_tied_head(&tied, false).is_ok());
        assert!(check_tied_head(&parse(&format!("{{{BASE}}}")).unwrap(), true).is_ok());
    }

    #[test]
    fn a_target_must_be_qwen3() {
        let ok = parse_target(&format!(r#"{{{BASE}, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}}"#));
        assert!(ok.is_ok());
        let e = parse_target(&format!(r#"{{{BASE}, "model_type": "llama"}}"#)).unwrap_err().to_string();
        assert!(e.contains("model_type") && e.contains("llama"), "{e}");
        let e = parse_target(&format!(r#"{{{BASE}, "architectures": ["Qwen2ForCausalLM"]}}"#)).unwrap_err().to_string();
        assert!(e.contains("architectures") && e.contains("Qwen2ForCausalLM"), "{e}");
    }
}
