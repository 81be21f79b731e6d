//! Reading HF-layout checkpoint folders: every file a model folder holds, checked against what
//! the engine expects, with errors that name the file and the field or tensor.
//!
//! * [`config`] — a Qwen3 target's `config.json`; [`draft_config`] and [`speculators`] — a
//!   DSpark draft's, in the DeepSpec native and the vLLM speculators packagings.
//! * [`safetensors`] — the weights, one file or a sharded index, memory-mapped.
//! * [`tokenizer`] — `tokenizer.json`, Qwen3's chat format and the ids that end a generation;
//!   [`chat_template`] — the folder's own Jinja chat template (`tokenizer_config.json`);
//!   [`detok`] — streaming text out, whole characters only.
//! * [`fp8`] — block-scaled FP8 weights (`quantization_config`), dequantized for the CPU.
//! * [`generation_config`] — `generation_config.json`'s sampling settings (`--sampling model`).
//! * [`info`] — `dspark info DIR`: a folder summarised without loading its weights.
//! * [`json`] — typed reads from a config object, each failure naming its field.

pub mod chat_template;
pub mod config;
pub mod detok;
pub mod draft_config;
pub mod fp8;
pub mod generation_config;
pub mod info;
pub mod json;
pub mod safetensors;
pub mod shared_heads;
pub mod speculators;
pub mod tokenizer;
