//! The CUDA backend: the same target and draft as [`crate::cpu`], behind the same traits.
//!
//! * [`qwen3`] — `CudaQwen3`, the target; [`dspark`] — `CudaDraft`, the draft.
//! * [`layers`] — decoder-layer weights (fused q|k|v, interleaved gate|up, folded RMSNorms) and
//!   the layer step both share; [`layers_gemm`] — that step on cuBLASLt GEMMs, one algorithm per
//!   shape, for `--activations bf16`.
//! * [`graphs`] — one CUDA graph per step shape, captured on first use and replayed.
//! * [`kv_vmm`] — paged K/V for `--kv-capacity`: physical pages mapped into each sequence's
//!   contiguous address range, so every kernel is unchanged.
//! * [`plan`] — what a target plans at load (context, KV type, embedding placement, prefill
//!   chunk) and its device bytes.
//! * [`tp`] — `CudaQwen3Tp`: a target split over the GPUs of one host (tensor parallel, NCCL).
//! * [`fp8`] — Qwen's block-scaled FP8 projections in the device layout the FP8 kernels read.
//! * [`weights`] — `WeightSource`: a checkpoint, or random bf16 weights made on the device for
//!   `dspark bench`.

pub mod dspark;
pub mod fit;
pub mod fp8;
pub mod graphs;
pub mod handoff;
pub mod kv_vmm;
pub mod layers;
pub mod layers_gemm;
pub mod plan;
pub mod prefill;
pub mod qwen3;
pub mod tp;
pub mod upload;
pub mod weights;
