//! The CPU reference path: f32 math from any on-disk dtype, the definition the CUDA backend is
//! tested against.
//!
//! * [`qwen3`] — the Qwen3 target, with its [`kv_cache`] (prefill, decode, verify, rollback,
//!   capture of chosen layers' outputs).
//! * [`dspark`] — the DSpark draft's backbone and context cache; [`markov`] — its sequential
//!   heads (Markov bias variants, confidence head, prefix survival), shared with the GPU draft.
//! * [`tp`] — the tensor-parallel reference: the target split over N ranks (`crate::tp`).

pub mod dspark;
pub mod kv_cache;
pub mod markov;
pub mod qwen3;
pub mod tp;
