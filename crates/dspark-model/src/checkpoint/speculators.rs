//! The vLLM *speculators* packaging of a DSpark draft (DSPARK.md §1.6), translated to
//! [`DraftConfig`] on load.
//!
//! Differences from the native format that change the math if missed:
//! * tapped layers are given as "aux hidden state" ids, which count the embedding output as 0,
//!   so DeepSpec's layer id = aux id − 1;
//! * the layer geometry sits in a nested `transformer_layer_config`;
//! * full-vocabulary drafts ship no `embed_tokens` / `lm_head` (they are the verifier's);
//! * `sample_from_anchor: false` marks the older 1+N DFlash slot layout, which this engine
//!   does not run, so it is refused rather than drafted wrong.

use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::draft_config::{DraftConfig, Packaging};
use crate::checkpoint::json::JsonObject;
use crate::error::Result;

/// Builds a [`DraftConfig`] from a speculators `config.json`.
pub fn draft_config(j: &JsonObject) -> Result<DraftConfig> {
    match j.opt_str("speculators_model_type")? {
        Some("dspark") => {}
        other => return Err(j.err("speculators_model_type", format!("expected \"dspark\", got {other:?}"))),
    }
    if j.opt_bool("sample_from_anchor")? == Some(false) {
        return Err(j.err("sample_from_anchor", "false (the 1+N DFlash slot layout) is not supported"));
    }
    let layer_json = j
        .opt_object("transformer_layer_config")?
        .ok_or_else(|| j.err("transformer_layer_config", "missing (required)"))?;
    let layer = Qwen3Config::from_json(&layer_json)?;
    if let Some(n) = j.opt_usize("draft_vocab_size")? {
        if n != layer.vocab_size {
            return Err(j.err(
                "draft_vocab_size",
                format!("{n} < vocab_size {}: reduced-vocabulary drafts (d2t) are not supported yet", layer.vocab_size),
            ));
        }
    }
    let aux = j
        .get("aux_hidden_state_layer_ids")
        .ok_or_else(|| j.err("aux_hidden_state_layer_ids", "missing (required)"))?
        .as_array()
        .ok_or_else(|| j.err("aux_hidden_state_layer_ids", "expected a list"))?
        .iter()
        .map(|v| v.as_u64().map(|x| x as usize))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| j.err("aux_hidden_state_layer_ids", "expected non-negative ids"))?;
    if aux.contains(&0) {
        return Err(j.err("aux_hidden_state_layer_ids", "id 0 (the embedding output) is not supported"));
    }
    let taps = aux.iter().map(|a| a - 1).collect();
    DraftConfig::from_parts(j, layer, taps, Packaging::Speculators)
}
