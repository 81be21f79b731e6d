//! Shared helpers for the integration tests: fixture paths and golden files.
//!
//! Goldens come from `fixtures/gen/make_target_fixtures.py` (transformers as the oracle):
//! `fixtures/golden/NAME.safetensors` holds f32 tensors, `fixtures/golden/NAME.json` the ids.
#![allow(dead_code)]

use dspark_model::checkpoint::safetensors::Checkpoint;
use std::path::PathBuf;

pub const TARGET_FIXTURES: [&str; 5] =
    ["qwen3-tiny-f32", "qwen3-tiny-sharded", "qwen3-tiny-bf16", "qwen3-tiny-tied", "qwen3-tiny-fp8"];

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("fixtures").join(name)
}

pub struct Golden {
    pub tensors: Checkpoint,
    pub json: serde_json::Value,
}

impl Golden {
    pub fn load(name: &str) -> Golden {
        let dir = repo_root().join("fixtures/golden");
        let tensors = Checkpoint::open_files(&[dir.join(format!("{name}.safetensors"))]).expect("golden tensors");
        let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("golden json");
        Golden { tensors, json: serde_json::from_str(&text).expect("golden json parses") }
    }

    pub fn ids(&self, key: &str) -> Vec<u32> {
        self.json[key]
            .as_array()
            .unwrap_or_else(|| panic!("golden json has no `{key}`"))
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect()
    }

    /// A golden f32 tensor with its shape.
    pub fn f32(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let shape = self.tensors.tensors.get(name).unwrap_or_else(|| panic!("golden has no `{name}`")).shape.clone();
        (self.tensors.f32(name, &shape).expect("golden tensor"), shape)
    }
}

/// ‖got − want‖₂ / ‖want‖₂, the usual relative error of a whole tensor. Used where the
/// reference itself rounds every op (transformers running in bf16/f16), so a single outlier
/// element measures the reference's rounding more than our math.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let num: f64 = got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().max(1e-300);
    (num / den).sqrt() as f32
}
