//! Element types and buffers.
//!
//! * [`dtype`]: the on-disk element types the engine accepts and their exact widening to f32,
//!   which both the CPU reference and the CUDA kernels compute in.
//! * [`arena`]: the device arena. Every device buffer (weights, KV caches, activations) is
//!   allocated through it while a model loads; decoding then only reuses those buffers, and
//!   the arena's allocation counter lets a test prove that no step allocates.

pub mod arena;
pub mod dtype;

pub use dtype::DType;
