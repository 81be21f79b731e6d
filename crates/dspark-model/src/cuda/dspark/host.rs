//! What a CUDA draft takes from the target it drafts for, on the same GPU: [`DraftHost`].
//!
//! The draft runs on its target's GPU and stream, reads the target's captured layers from a
//! buffer they share, leaves its proposals where the target's verify reads them, and borrows
//! the target's embedding and output head when its own copies equal them. A single-GPU target
//! (`CudaQwen3`) hands over all of that; a target split over GPUs (`cuda::tp::CudaQwen3Tp`)
//! hands over rank 0's GPU and buffers, and no heads — its embedding and head are vocabulary
//! shards — so its draft loads its own (a published DSpark draft ships both).

use crate::checkpoint::config::Qwen3Config;
use crate::cuda::handoff::{SharedCapture, SharedDraftRows, SharedTokens};
use crate::cuda::qwen3::CudaQwen3;
use dspark_kernels::cuda::gemm::Blas;
use dspark_kernels::cuda::host_table::Table;
use dspark_kernels::cuda::kv::KvDtype;
use dspark_kernels::cuda::ops::WeightBuf;
use dspark_kernels::cuda::Gpu;
use std::sync::Arc;

/// The target side of a CUDA draft (see the module docs).
pub struct DraftHost {
    pub gpu: Arc<Gpu>,
    /// The target's config (the draft is checked against it).
    pub cfg: Qwen3Config,
    /// Context positions the draft plans for.
    pub max_len: usize,
    pub kv_dtype: KvDtype,
    /// The target's `embed_tokens` and output head on this GPU, whole; `None` for a split target.
    pub heads: Option<(Arc<Table>, Arc<WeightBuf>)>,
    /// The target's cuBLAS handle, for the draft's GEMM context append (`None`: no GEMM prefill).
    pub prefill_blas: Option<Arc<Blas>>,
    /// Rows of the target's prefill chunks (`--prefill-chunk`): the draft's GEMM append plans no more.
    pub prefill_rows: usize,
    /// The target's prefill capture buffer (a prompt's captures straight from the device).
    pub prefill_capture: Option<SharedCapture>,
    /// The decode steps' capture buffer.
    pub capture: SharedCapture,
    /// Where the draft leaves its proposals for the target's verify.
    pub tokens: SharedTokens,
    /// Where a sampled draft leaves the rows it drew from.
    pub draft_rows: SharedDraftRows,
}

impl DraftHost {
    /// A single-GPU target's side.
    pub fn of(target: &CudaQwen3) -> DraftHost {
        use crate::backend::TargetModel;
        DraftHost {
            gpu: target.gpu.clone(),
            cfg: target.config().clone(),
            max_len: target.max_len(),
            kv_dtype: target.kv_dtype(),
            heads: Some((target.embed_tokens.clone(), target.lm_head.clone())),
            prefill_blas: target.prefill_blas(),
            prefill_rows: target.prefill_rows(),
            prefill_capture: target.shared_prefill_capture(),
            capture: target.shared_capture(),
            tokens: target.shared_tokens(),
            draft_rows: target.shared_draft_rows(),
        }
    }
}
