//! The draft's per-sequence contexts on paged K/V (`--kv-capacity`, issue #30): the target's
//! mechanism (`cuda::kv_vmm`) for the draft's five layers.
//!
//! Each sequence's context gets an address range of `max_len + block` positions per layer
//! buffer, and pages are mapped into it so that it always holds its context plus one block: the
//! block pass writes the block's rows after the context (`launch_block`), so every append first
//! makes room for `ctx_len + n + block` positions ([`CudaDraft::check_room`]) and a new sequence
//! starts with room for one block. A sequence keeps its pages until it closes (a draft context
//! is only ever rolled back by the bench), when all of them go back.
//!
//! How many pages: a request's draft context never outgrows its target sequence, so the pages
//! the target's budget holds, in the draft's page size, plus two per sequence (the block past
//! the context, and each sequence's partial last page) cover every admitted request.

use super::{CudaDraft, DraftSeq};
use crate::batch::KvBudget;
use crate::cuda::kv_vmm::{KvPages, VirtualKv};
use crate::cuda::layers::{drv, gpu_err};
use crate::error::{Error, Result};
use dspark_kernels::cuda::kv_layers::LayerCaches;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};

/// A context's layer caches: owned (contiguous, from the arena), or lent by the paged range
/// they live in, which takes them back when this is dropped.
pub struct CtxCaches {
    layers: ManuallyDrop<LayerCaches>,
    virt: Option<VirtualKv>,
}

impl CtxCaches {
    pub(super) fn owned(layers: LayerCaches) -> CtxCaches {
        CtxCaches { layers: ManuallyDrop::new(layers), virt: None }
    }
}

impl Deref for CtxCaches {
    type Target = LayerCaches;
    fn deref(&self) -> &LayerCaches {
        &self.layers
    }
}

impl DerefMut for CtxCaches {
    fn deref_mut(&mut self) -> &mut LayerCaches {
        &mut self.layers
    }
}

impl Drop for CtxCaches {
    fn drop(&mut self) {
        // SAFETY: `layers` is taken (or dropped) once, here, and not used after.
        let layers = unsafe { ManuallyDrop::take(&mut self.layers) };
        match self.virt.as_mut() {
            Some(v) => v.put_caches(layers.into_caches()),
            None => drop(layers),
        }
    }
}

impl CudaDraft {
    /// Plans paged contexts for `n` sequences of a target whose pages are `target` (the
    /// target's `CudaBatch::paged` budget); see the module docs.
    pub fn reserve_sequences_paged(&mut self, n: usize, target: KvBudget) -> Result<()> {
        let l = &self.cfg.layer;
        let (layers, kv, b) = (l.num_hidden_layers, l.kv_dim(), self.cfg.block_size);
        let shape = (layers, kv, self.max_len + b);
        let pages = KvPages::new(self.gpu.clone(), self.caches.dtype(), shape, (target.pages * target.page, 2 * n))?;
        for _ in 0..n {
            let mut virt = pages.reserve()?;
            let caches = virt.take_caches().ok_or_else(|| Error::Request("paged draft context: no caches".into()))?;
            let ptrs = (self.arena.zeros::<u64>(layers).map_err(drv)?, self.arena.zeros::<u64>(layers).map_err(drv)?);
            let layer_caches = match LayerCaches::new(&self.gpu, caches, ptrs, kv) {
                Ok(c) => c,
                Err(e) => return Err(gpu_err(e)),
            };
            self.seq_pool.push(CtxCaches { layers: ManuallyDrop::new(layer_caches), virt: Some(virt) });
        }
        self.ctx_pages = Some(pages);
        self.plan_block_batch()
    }

    /// Bytes of device memory the context pages take (`None`: contiguous contexts).
    pub fn ctx_page_bytes(&self) -> Option<usize> {
        self.ctx_pages.as_ref().map(KvPages::bytes)
    }

    /// Pages of the paged contexts free now (`None`: contiguous contexts).
    pub fn ctx_pages_free(&self) -> Option<usize> {
        self.ctx_pages.as_ref().map(KvPages::free)
    }

    /// Maps pages into `caches` (a paged context) until it holds `positions`.
    pub(super) fn cover_ctx(pages: &mut Option<KvPages>, caches: &mut CtxCaches, positions: usize) -> Result<()> {
        match (pages.as_mut(), caches.virt.as_mut()) {
            (Some(p), Some(v)) => p.cover(v, positions),
            _ => Ok(()),
        }
    }

    /// A paged context's pages back to the pool (a closed sequence).
    pub(super) fn release_ctx(&mut self, state: &mut DraftSeq) -> Result<()> {
        match (self.ctx_pages.as_mut(), state.caches.virt.as_mut()) {
            (Some(p), Some(v)) => p.shrink(v, 0),
            _ => Ok(()),
        }
    }
}
