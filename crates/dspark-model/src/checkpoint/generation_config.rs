//! `generation_config.json`: the sampling settings a model folder recommends, and its stop ids.
//!
//! Read by `dspark generate --sampling model`, and meant for the server too, where fields a
//! request omits take these values. The fields read are transformers' names:
//!
//! ```text
//! do_sample    false or absent: greedy decoding (temperature 0), whatever the file's temperature
//! temperature  absent with do_sample: 1.0                  finite, ≥ 0
//! top_k        absent: 0 (off)                              a non-negative integer
//! top_p        absent: 1.0 (off)                            in (0, 1]
//! min_p        absent: 0.0 (off)                            in [0, 1]
//! eos_token_id an integer or a list (see [`crate::checkpoint::tokenizer::eos_ids`])
//! ```
//!
//! An absent `top_k` is off, as vLLM reads the file (only the fields the file sets), not
//! transformers' `GenerationConfig` default of 50. Qwen3's published files set every field
//! (`do_sample: true, temperature: 0.6, top_k: 20, top_p: 0.95`). A value out of range is an
//! error naming the file and the field, never clamped.

use crate::checkpoint::json::JsonObject;
use crate::error::Result;
use std::path::Path;

/// The fields of one `generation_config.json` the engine uses, as the file states them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// `do_sample`; absent is false, as in transformers.
    pub do_sample: bool,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    /// `eos_token_id`, an integer or a list; empty when absent.
    pub eos_token_ids: Vec<u32>,
}

/// The settings a request takes from the model when it gives none of its own: plain values in
/// the sampler's conventions (temperature 0 = greedy, top-k 0 / top-p 1 / min-p 0 = off).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
}

impl SamplingDefaults {
    /// Greedy decoding, every filter off: what a folder without the file (or with
    /// `do_sample` false and no filters) gives.
    pub const GREEDY: SamplingDefaults = SamplingDefaults { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0 };
}

impl GenerationConfig {
    /// Reads `<dir>/generation_config.json`; `None` when the folder has none.
    pub fn from_dir(dir: &Path) -> Result<Option<GenerationConfig>> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(None);
        }
        Self::from_json(&JsonObject::read(&path)?).map(Some)
    }

    pub fn from_json(j: &JsonObject) -> Result<GenerationConfig> {
        let do_sample = j.opt_bool("do_sample")?.unwrap_or(false);
        let temperature = opt_f32(j, "temperature", |t| t >= 0.0, "a finite number ≥ 0")?;
        let top_k = j.opt_usize("top_k")?;
        let top_p = opt_f32(j, "top_p", |p| p > 0.0 && p <= 1.0, "in (0, 1]")?;
        let min_p = opt_f32(j, "min_p", |p| (0.0..=1.0).contains(&p), "in [0, 1]")?;
        let eos_token_ids = j.id_list("eos_token_id")?;
        Ok(GenerationConfig { do_sample, temperature, top_k, top_p, min_p, eos_token_ids })
    }

    /// The settings this file recommends: greedy (temperature 0) unless `do_sample`, absent
    /// fields at their defaults (see the module docs).
    pub fn sampling(&self) -> SamplingDefaults {
        SamplingDefaults {
            temperature: if self.do_sample { self.temperature.unwrap_or(1.0) } else { 0.0 },
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
        }
    }
}

/// An optional finite number that must satisfy `ok`, read as f32 (the sampler's type).
fn opt_f32(j: &JsonObject, field: &str, ok: impl Fn(f32) -> bool, range: &str) -> Result<Option<f32>> {
    match j.opt_f64(field)? {
        None => Ok(None),
        Some(v) => {
            let x = v as f32;
            if x.is_finite() && ok(x) {
                Ok(Some(x))
            } else {
                Err(j.err(field, format!("must be {range}, got {v}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<GenerationConfig> {
        GenerationConfig::from_json(&JsonObject::parse(Path::new("m/generation_config.json"), text)?)
    }

    #[test]
    fn qwen3s_published_file_samples() {
        // Qwen/Qwen3-8B's generation_config.json.
        let g = parse(
            r#"{"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
                "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                "transformers_version": "4.51.0"}"#,
        )
        .unwrap();
        assert_eq!(g.eos_token_ids, vec![151645, 151643]);
        assert_eq!(g.sampling(), SamplingDefaults { temperature: 0.6, top_k: 20, top_p: 0.95, min_p: 0.0 });
    }

    #[test]
    fn without_do_sample_it_is_greedy() {
        assert_eq!(parse("{}").unwrap().sampling(), SamplingDefaults::GREEDY);
        let g = parse(r#"{"do_sample": false, "temperature": 0.7, "top_k": 5}"#).unwrap();
        assert_eq!(g.temperature, Some(0.7));
        assert_eq!(g.sampling(), SamplingDefaults { temperature: 0.0, top_k: 5, ..SamplingDefaults::GREEDY });
        // do_sample alone: transformers' temperature 1, filters off.
        let g = parse(r#"{"do_sample": true, "min_p": 0.05, "top_k": null}"#).unwrap();
        assert_eq!(g.sampling(), SamplingDefaults { temperature: 1.0, min_p: 0.05, ..SamplingDefaults::GREEDY });
    }

    #[test]
    fn absent_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(GenerationConfig::from_dir(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join("generation_config.json"), r#"{"do_sample": true}"#).unwrap();
        assert!(GenerationConfig::from_dir(dir.path()).unwrap().unwrap().do_sample);
    }

    #[test]
    fn bad_fields_name_the_file_and_the_field() {
        for (text, field) in [
            (r#"{"do_sample": "yes"}"#, "do_sample"),
            (r#"{"temperature": -0.5}"#, "temperature"),
            (r#"{"temperature": "hot"}"#, "temperature"),
            (r#"{"temperature": 1e300}"#, "temperature"),
            (r#"{"top_k": -1}"#, "top_k"),
            (r#"{"top_k": 2.5}"#, "top_k"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_p": 1.5}"#, "top_p"),
            (r#"{"min_p": -0.1}"#, "min_p"),
            (r#"{"min_p": 2}"#, "min_p"),
            (r#"{"eos_token_id": "x"}"#, "eos_token_id"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains("m/generation_config.json") && e.contains(&format!("`{field}`")), "{text}: {e}");
        }
        let e = parse(r#"{"top_p": 1.5}"#).unwrap_err().to_string();
        assert!(e.contains("in (0, 1], got 1.5"), "{e}");
    }
}
