//! Op families of the dspark engine, lowest layer of the workspace.
//!
//! Every op exists first as a plain CPU reference in [`cpu`], written for clarity and
//! computed in f32. The CPU reference is what the Qwen3 and DSpark CPU paths run, and it is
//! the oracle that every faster implementation (the multithreaded matmul here, the CUDA
//! kernels of `kernels/*.cu` later) is tested against on fresh random inputs.
//!
//! This crate depends on nothing else in the workspace (Architecture Invariant: layers import
//! only downward, kernels → tensor → model → spec → cli).

pub mod activations;
pub mod cpu;
pub mod cuda;
pub mod kv_dtype;

pub use activations::Activations;
pub use kv_dtype::KvDtype;
