//! Checkpoint loading and model math for dspark, grouped by what each part is:
//!
//! * [`checkpoint`] reads HF-layout folders (configs of targets and drafts in both packagings,
//!   safetensors, the tokenizer, `dspark info`), refusing anything inconsistent with an error
//!   that names the file and the field or tensor.
//! * [`cpu`] is the f32 reference path: the Qwen3 target with its KV cache, the DSpark draft and
//!   its Markov and confidence heads.
//! * [`cuda`] is the GPU backend of the same target and draft, with its CUDA graphs and weight
//!   sources.
//! * [`backend`] holds the traits the decoding loops drive ([`TargetModel`], [`Drafter`]), so
//!   one loop runs on either backend.
//! * [`testing`] makes random tiny models for property tests.

pub mod backend;
pub mod batch;
pub mod checkpoint;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod fuzzing;
pub mod kv_pages;
pub mod testing;
pub mod tp;

pub use backend::{
    Captured, Deferred, DeviceRows, DeviceSampled, DeviceTokens, Drafter, Filters, Forward, Greedy, LogitRows,
    Proposal, SampledVerify, TargetModel, VerifyOutcome,
};
pub use batch::{BatchDrafter, BatchTarget, KvBudget, SeqId, SeqState, Sequences};
pub use checkpoint::config::Qwen3Config;
pub use error::{Error, Result};
