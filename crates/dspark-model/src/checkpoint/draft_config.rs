//! `config.json` of a DSpark draft, in the DeepSpec native format (DSPARK.md §1.2).
//!
//! The native config is a copy of the target's Qwen3 config with draft keys added, so the layer
//! geometry is parsed by [`Qwen3Config`] and only the draft keys are read here:
//! `block_size`, `mask_token_id`, `target_layer_ids`, `markov_rank`, `markov_head_type`,
//! `enable_confidence_head`, `confidence_head_with_markov`. `num_hidden_layers` is the draft's
//! depth. The DFlash baselines are the same architecture with `markov_rank` 0 and no
//! confidence head, so they load through the same path.
//!
//! [`DraftConfig::validate_against`] checks the pair: the draft's geometry must match the
//! target (it reuses the target's embedding and output head), and every tapped layer must be a
//! real target layer other than the last (DSPARK.md §1.7: the last layer's HF hidden state is
//! post-norm, and the drafts were trained on raw layer outputs).

use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::json::JsonObject;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The sequential head that biases each slot's logits by the previous token (DSPARK.md §3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkovKind {
    Vanilla,
    Gated,
    Rnn,
}

/// Which on-disk packaging the draft came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packaging {
    /// DeepSpec's own format (`architectures: ["Qwen3DSparkModel"]`).
    Native,
    /// vLLM speculators (`speculators_model_type: "dspark"`).
    Speculators,
}

/// Everything the draft's math depends on.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftConfig {
    pub path: PathBuf,
    pub packaging: Packaging,
    /// Geometry of the draft layers (`num_hidden_layers` = draft depth).
    pub layer: Qwen3Config,
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Target decoder layers whose outputs feed `fc`, in DeepSpec numbering (0-based layer
    /// index; speculators' ids are converted on load).
    pub target_layer_ids: Vec<usize>,
    pub num_target_layers: Option<usize>,
    /// 0 means no Markov head (the DFlash baseline).
    pub markov_rank: usize,
    pub markov_kind: MarkovKind,
    pub confidence_head: bool,
    pub confidence_with_markov: bool,
}

impl DraftConfig {
    /// Reads `<dir>/config.json` in either packaging.
    pub fn from_dir(dir: &Path) -> Result<DraftConfig> {
        Self::from_json(&JsonObject::read(&dir.join("config.json"))?)
    }

    /// A draft `config.json` already parsed (from a file, or text compiled into the binary), in
    /// either packaging.
    pub fn from_json(j: &JsonObject) -> Result<DraftConfig> {
        if j.get("speculators_model_type").is_some() {
            return crate::checkpoint::speculators::draft_config(j);
        }
        Self::native(j)
    }

    /// The DeepSpec native format.
    pub fn native(j: &JsonObject) -> Result<DraftConfig> {
        let arch = j.get("architectures").and_then(|v| v.as_array()).and_then(|a| a.first()).and_then(|v| v.as_str());
        if arch != Some("Qwen3DSparkModel") {
            return Err(j.err(
                "architectures",
                format!("expected [\"Qwen3DSparkModel\"] for a DSpark draft, got {:?}", j.get("architectures")),
            ));
        }
        let layer = Qwen3Config::from_json(j)?;
        let taps = j
            .get("target_layer_ids")
            .ok_or_else(|| j.err("target_layer_ids", "missing (required)"))?
            .as_array()
            .ok_or_else(|| j.err("target_layer_ids", "expected a list of layer indices"))?
            .iter()
            .map(|v| v.as_u64().map(|x| x as usize))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| j.err("target_layer_ids", "expected non-negative layer indices"))?;
        Self::from_parts(j, layer, taps, Packaging::Native)
    }

    /// Reads the draft keys shared by both packagings and checks them for self-consistency.
    pub(crate) fn from_parts(
        j: &JsonObject,
        layer: Qwen3Config,
        taps: Vec<usize>,
        packaging: Packaging,
    ) -> Result<DraftConfig> {
        let markov_rank = j.opt_usize("markov_rank")?.unwrap_or(0);
        let markov_kind = match j.opt_str("markov_head_type")?.unwrap_or("vanilla") {
            "vanilla" => MarkovKind::Vanilla,
            "gated" => MarkovKind::Gated,
            "rnn" => MarkovKind::Rnn,
            other => {
                return Err(j.err("markov_head_type", format!("unknown head type {other:?} (vanilla, gated, rnn)")))
            }
        };
        let confidence_head = j.opt_bool("enable_confidence_head")?.unwrap_or(false);
        let mask = j.usize("mask_token_id")?;
        let block_size = j.positive("block_size")?;
        if taps.is_empty() {
            return Err(j.err("target_layer_ids", "is empty"));
        }
        if taps.windows(2).any(|w| w[0] >= w[1]) {
            return Err(j.err("target_layer_ids", format!("must be strictly increasing, got {taps:?}")));
        }
        if mask >= layer.vocab_size {
            return Err(j.err("mask_token_id", format!("{mask} is outside the vocabulary of {}", layer.vocab_size)));
        }
        Ok(DraftConfig {
            path: j.path.clone(),
            packaging,
            block_size,
            mask_token_id: mask as u32,
            target_layer_ids: taps,
            num_target_layers: j.opt_usize("num_target_layers")?,
            markov_rank,
            markov_kind,
            confidence_head,
            confidence_with_markov: confidence_head && j.opt_bool("confidence_head_with_markov")?.unwrap_or(false),
            layer,
        })
    }

    /// Number of tapped target layers (T); `fc` maps `T · hidden` to `hidden`.
    pub fn num_taps(&self) -> usize {
        self.target_layer_ids.len()
    }

    /// Rows in `len` floats of `[n, T · hidden]` context features, or an error naming the
    /// row width when they are not whole rows.
    pub fn feature_rows(&self, len: usize) -> Result<usize> {
        let row = self.num_taps() * self.layer.hidden_size;
        if !len.is_multiple_of(row) {
            return Err(Error::Request(format!(
                "draft context features of length {len} are not whole rows of {} taps × {}",
                self.num_taps(),
                self.layer.hidden_size
            )));
        }
        Ok(len / row)
    }

    /// Width of the confidence head's input: `hidden`, plus `markov_rank` when it also reads
    /// the previous token's Markov embedding.
    pub fn confidence_in(&self) -> usize {
        self.layer.hidden_size + if self.confidence_with_markov { self.markov_rank } else { 0 }
    }

    /// Checks that this draft can run against `target`.
    pub fn validate_against(&self, target: &Qwen3Config) -> Result<()> {
        let err = |field: &str, msg: String| Error::config(&self.path, field, msg);
        let d = &self.layer;
        for (field, a, b) in [
            ("hidden_size", d.hidden_size, target.hidden_size),
            ("vocab_size", d.vocab_size, target.vocab_size),
            ("num_attention_heads", d.num_attention_heads, target.num_attention_heads),
            ("num_key_value_heads", d.num_key_value_heads, target.num_key_value_heads),
            ("head_dim", d.head_dim, target.head_dim),
        ] {
            if a != b {
                return Err(err(field, format!("draft has {a} but the target has {b}")));
            }
        }
        let last_allowed = target.num_hidden_layers.saturating_sub(2);
        if let Some(&bad) = self.target_layer_ids.iter().find(|&&l| l > last_allowed) {
            return Err(err(
                "target_layer_ids",
                format!(
                    "layer {bad} is not a usable tap for a {}-layer target (allowed 0..={last_allowed}; the last layer is excluded)",
                    target.num_hidden_layers
                ),
            ));
        }
        if let Some(n) = self.num_target_layers {
            if n != target.num_hidden_layers {
                return Err(err(
                    "num_target_layers",
                    format!("draft was made for {n} target layers, the target has {}", target.num_hidden_layers),
                ));
            }
        }
        Ok(())
    }
}
