//! The demo pair compiled into the binary: `fixtures/coder-target` (a 4 M-parameter Qwen3
//! trained on Python's standard library, `train/`) and its DSpark draft `fixtures/coder-draft`,
//! which `dspark generate` runs when given no `--target`.
//!
//! Every file the loaders read is embedded with `include_bytes!` / `include_str!` (about 12 MB),
//! rather than looked up beside the executable, so a copied release binary runs the demo
//! anywhere with nothing else to ship or keep in step. The bytes go through the same parsers
//! and checks as a folder's files ([`Checkpoint::from_static`], [`JsonObject::parse`],
//! [`Tokenizer::from_bytes`]); messages name them as `<embedded demo>/coder-target/…`.

use dspark_model::checkpoint::json::JsonObject;
use dspark_model::checkpoint::safetensors::Checkpoint;
use dspark_model::checkpoint::tokenizer::Tokenizer;
use dspark_model::Result;
use std::path::{Path, PathBuf};

/// One model folder's files, compiled in.
pub struct EmbeddedModel {
    /// The virtual folder messages name, e.g. `<embedded demo>/coder-target`.
    pub dir: &'static str,
    pub config: &'static str,
    pub weights: &'static [u8],
    pub tokenizer: Option<&'static [u8]>,
    pub generation_config: Option<&'static str>,
}

macro_rules! fixture {
    ($file:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/", $file)
    };
}

/// The demo target.
pub static TARGET: EmbeddedModel = EmbeddedModel {
    dir: "<embedded demo>/coder-target",
    config: include_str!(fixture!("coder-target/config.json")),
    weights: include_bytes!(fixture!("coder-target/model.safetensors")),
    tokenizer: Some(include_bytes!(fixture!("coder-target/tokenizer.json"))),
    generation_config: Some(include_str!(fixture!("coder-target/generation_config.json"))),
};

/// The demo target's DSpark draft.
pub static DRAFT: EmbeddedModel = EmbeddedModel {
    dir: "<embedded demo>/coder-draft",
    config: include_str!(fixture!("coder-draft/config.json")),
    weights: include_bytes!(fixture!("coder-draft/model.safetensors")),
    tokenizer: None,
    generation_config: None,
};

/// The demo's prompt when none is given: the start of a Python function.
pub const PROMPT: &str = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";

impl EmbeddedModel {
    /// The virtual path of one of this model's files, for messages.
    pub fn file(&self, name: &str) -> PathBuf {
        Path::new(self.dir).join(name)
    }

    /// `config.json`, parsed.
    pub fn config_json(&self) -> Result<JsonObject> {
        JsonObject::parse(&self.file("config.json"), self.config)
    }

    /// `generation_config.json`, parsed, if the folder has one.
    pub fn generation_config_json(&self) -> Result<Option<JsonObject>> {
        self.generation_config.map(|text| JsonObject::parse(&self.file("generation_config.json"), text)).transpose()
    }

    /// `model.safetensors`, checked as a file's would be.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        Checkpoint::from_static(self.file("model.safetensors"), self.weights)
    }

    /// `tokenizer.json`, if the folder has one.
    pub fn tokenizer(&self) -> Result<Option<Tokenizer>> {
        self.tokenizer.map(|bytes| Tokenizer::from_bytes(&self.file("tokenizer.json"), bytes)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dspark_model::checkpoint::config::Qwen3Config;
    use dspark_model::checkpoint::draft_config::DraftConfig;

    /// Each embedded file is there and parses; the fixtures folders hold nothing else the
    /// loaders would read.
    #[test]
    fn the_embedded_pair_parses_and_is_complete() {
        let cfg = Qwen3Config::from_json(&TARGET.config_json().unwrap()).unwrap();
        let draft = DraftConfig::from_json(&DRAFT.config_json().unwrap()).unwrap();
        draft.validate_against(&cfg).unwrap();
        assert!(TARGET.checkpoint().unwrap().contains("model.embed_tokens.weight"));
        assert!(!DRAFT.checkpoint().unwrap().tensors.is_empty());
        assert!(TARGET.tokenizer().unwrap().is_some());
        assert!(TARGET.generation_config_json().unwrap().is_some());
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        for (model, dir) in [(&TARGET, "coder-target"), (&DRAFT, "coder-draft")] {
            let mut on_disk: Vec<String> = std::fs::read_dir(root.join(dir))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            on_disk.sort();
            let mut embedded = vec!["config.json".to_string(), "model.safetensors".to_string()];
            if model.tokenizer.is_some() {
                embedded.push("tokenizer.json".into());
            }
            if model.generation_config.is_some() {
                embedded.push("generation_config.json".into());
            }
            embedded.sort();
            assert_eq!(on_disk, embedded, "{dir}: a file the demo folder holds is not embedded (or the reverse)");
        }
    }
}
