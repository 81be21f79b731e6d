//! Checkpoint loading and model math for dspark.
//!
//! * [`config`] and [`safetensors`] read HF-layout checkpoint folders, refusing anything
//!   inconsistent with an error that names the file and the field or tensor.
//! * [`qwen3`] is the Qwen3 target on the CPU reference path (f32 compute from any on-disk
//!   dtype), with a KV cache that supports prefill, decode, k-token verify, rollback, and capture
//!   of chosen decoder layers' outputs.
//! * [`backend`] is the interface the speculative loop drives, so the same loop runs on the CPU
//!   reference and, later, on CUDA.
//! * [`draft_config`], [`dspark`], [`markov`] and [`speculators`] are the DSpark draft: its
//!   config in both packagings, the CPU backbone with its context cache, and the sequential heads.
//! * [`tokenizer`] wraps HF `tokenizer.json` and Qwen3's chat format.
//! * [`info`] summarises a checkpoint folder for `dspark info`.

pub mod backend;
pub mod config;
pub mod cuda_dspark;
pub mod cuda_graphs;
pub mod cuda_layers;
pub mod cuda_qwen3;
pub mod draft_config;
pub mod dspark;
pub mod error;
pub mod info;
pub mod json;
pub mod kv_cache;
pub mod markov;
pub mod qwen3;
pub mod safetensors;
pub mod speculators;
pub mod testing;
pub mod tokenizer;
pub mod weights;

pub use backend::{
    Captured, Deferred, DeviceRows, DeviceTokens, Drafter, Forward, Greedy, LogitRows, Proposal, TargetModel,
};
pub use config::Qwen3Config;
pub use error::{Error, Result};
