//! The draft's state per sequence, for a batch of requests (issue #30): a sequence's context
//! caches and length, swapped into the draft for its proposals through `batch::Sequences`.
//!
//! Every context cache is planned from the arena when the batch is set up
//! ([`CudaDraft::reserve_sequences`]), so opening a sequence allocates nothing and a full pool
//! is a clear error rather than an out-of-memory in the middle of a round. A cache goes back to
//! the pool when its sequence closes. CUDA graphs key on the caches' address
//! (`DraftStep`), so each sequence's graphs write its own caches.

use super::paged::CtxCaches;
use super::CudaDraft;
use crate::batch::SeqState;
use crate::cuda::layers::{drv, gpu_err, kv_caches};
use crate::error::{Error, Result};
use dspark_kernels::cuda::kv_layers::LayerCaches;

/// One sequence's draft context: every layer's K/V cache and the positions it holds.
pub struct DraftSeq {
    pub(super) caches: CtxCaches,
    pub(super) ctx_len: usize,
}

impl CudaDraft {
    /// Plans context caches for `n` more sequences, each as long as the draft's own.
    pub fn reserve_sequences(&mut self, n: usize) -> Result<()> {
        let l = &self.cfg.layer;
        let (layers, kv) = (l.num_hidden_layers, l.kv_dim());
        let cache_len = (self.max_len + self.cfg.block_size) * kv;
        for _ in 0..n {
            let caches = kv_caches(&self.arena, self.caches.dtype(), layers, cache_len)?;
            let ptrs = (self.arena.zeros::<u64>(layers).map_err(drv)?, self.arena.zeros::<u64>(layers).map_err(drv)?);
            self.seq_pool.push(CtxCaches::owned(LayerCaches::new(&self.gpu, caches, ptrs, kv).map_err(gpu_err)?));
        }
        self.plan_block_batch()
    }
}

impl SeqState for CudaDraft {
    type State = DraftSeq;

    fn new_state(&mut self) -> Result<DraftSeq> {
        let mut caches = self.seq_pool.pop().ok_or_else(|| {
            Error::Request("every planned draft context is in use (CudaDraft::reserve_sequences)".into())
        })?;
        // A paged context starts with room for one block (`paged.rs`).
        let block = self.cfg.block_size;
        if let Err(e) = Self::cover_ctx(&mut self.ctx_pages, &mut caches, block) {
            self.seq_pool.push(caches);
            return Err(e);
        }
        Ok(DraftSeq { caches, ctx_len: 0 })
    }

    fn swap_state(&mut self, state: &mut DraftSeq) {
        std::mem::swap(&mut self.caches, &mut state.caches);
        std::mem::swap(&mut self.ctx_len, &mut state.ctx_len);
    }

    fn release_state(&mut self, mut state: DraftSeq) {
        // A paged context's pages go back; a driver error unmapping them is reported, and the
        // context is kept out of the pool (its range may still be mapped).
        match self.release_ctx(&mut state) {
            Ok(()) => self.seq_pool.push(state.caches),
            Err(e) => eprintln!("dspark: releasing a draft context's pages: {e}"),
        }
    }
}
