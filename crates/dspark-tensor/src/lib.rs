//! Element types and buffers.
//!
//! Today this crate holds the on-disk element types the engine accepts and their widening to
//! f32, which the CPU reference path computes in. The device arena (every activation buffer
//! planned at load, zero allocations per token) lands here with the CUDA backend.

pub mod dtype;

pub use dtype::DType;
