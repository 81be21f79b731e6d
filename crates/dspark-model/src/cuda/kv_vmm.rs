//! Paged K/V on the GPU through the driver's virtual memory management (issue #30,
//! `--kv-capacity`): pages of physical memory mapped into each sequence's contiguous range.
//!
//! vLLM pages its K/V by giving every attention kernel a block table. vAttention (Prabhu et al.,
//! ASPLOS 2025) gets the same memory behaviour without touching a kernel: each sequence reserves
//! a *virtual* range as long as its whole context — address space costs nothing — and physical
//! memory is mapped into it a page at a time as the sequence grows (`cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`), and unmapped when it is rolled back or closed. The kernels
//! see an ordinary contiguous cache (`KvCaches`, each layer `max_len` rows), read only rows below
//! the keys they were given (every load is guarded by the slice's key bound), so their launches
//! and their bits are those of the contiguous caches.
//!
//! ```text
//! physical: [chunk 0][chunk 1] ... [chunk P·2L−1]      each `gran` bytes (2 MiB on an H200)
//! page p  = chunks p·2L .. p·2L + 2L − 1: one for every layer's K and V buffer
//! sequence: buffer b's range  [va_b + 0·gran][va_b + 1·gran] ...   its page i → chunk p_i·2L + b
//! ```
//!
//! A page holds `gran / row_bytes` positions (1,024 for Qwen3-8B's bf16 rows of 2 KiB; a row may
//! straddle two chunks of the range, both mapped). The page ids come from a bounded
//! [`PagePool`]: the pages are created at start-up for `--kv-capacity`, and the scheduler admits
//! requests by them ([`KvBudget`]), so mapping never fails for an admitted request. Unmapping
//! waits for the stream first: no kernel still in flight reads a page being taken away.

use crate::batch::KvBudget;
use crate::cuda::layers::drv;
use crate::kv_pages::{PagePool, Pages};
use crate::{Error, Result};
use cudarc::driver::sys;
use dspark_kernels::cuda::kv::{KvCaches, KvDtype};
use dspark_kernels::cuda::Gpu;
use std::sync::Arc;

/// A driver call's result as this crate's error, naming the call.
fn check(call: &str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| Error::Request(format!("{call}: {e:?}")))
}

/// The physical pages of one batch's K/V and the ids of those free (see the module docs).
pub struct KvPages {
    gpu: Arc<Gpu>,
    /// Bytes of one chunk: the driver's mapping granularity.
    gran: usize,
    /// Chunks of a page: one per layer's K and V buffer.
    per_page: usize,
    handles: Vec<sys::CUmemGenericAllocationHandle>,
    pool: PagePool,
    /// Positions a page holds.
    positions: usize,
    dtype: KvDtype,
    layers: usize,
    /// Positions a sequence's range holds.
    max_len: usize,
    /// Values of one position (`n_kv_heads · head_dim`).
    row: usize,
}

/// One sequence's caches over its reserved ranges, and the pages mapped into them.
pub struct VirtualKv {
    gpu: Arc<Gpu>,
    gran: usize,
    /// Slices over the ranges (never freed by cudarc: `Drop` leaks them, then frees the ranges).
    caches: Option<KvCaches>,
    /// Each buffer's range: K of every layer, then V.
    bases: Vec<sys::CUdeviceptr>,
    range_bytes: usize,
    pages: Pages,
}

impl KvPages {
    /// Pages for `capacity` positions of `layers` layers' K and V caches of `row` values of
    /// `dtype` a position, created now; sequences of up to `max_len` positions.
    pub fn new(
        gpu: Arc<Gpu>,
        dtype: KvDtype,
        (layers, row, max_len): (usize, usize, usize),
        (capacity, extra_pages): (usize, usize),
    ) -> Result<KvPages> {
        gpu.ctx.bind_to_thread().map_err(drv)?;
        let prop = Self::prop(&gpu);
        let mut gran = 0usize;
        // SAFETY: `prop` describes device memory of this context's device; `gran` is written.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        let row_bytes = row * dtype.bytes();
        if gran == 0 || row_bytes == 0 || row_bytes > gran {
            return Err(Error::Request(format!("paged K/V: rows of {row_bytes} bytes in chunks of {gran}")));
        }
        let positions = gran / row_bytes;
        let pages = capacity.div_ceil(positions).max(1) + extra_pages;
        let per_page = 2 * layers;
        let mut handles = Vec::with_capacity(pages * per_page);
        for _ in 0..pages * per_page {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `h` is written on success; the handle is released in `Drop`.
            let r = unsafe { sys::cuMemCreate(&mut h, gran, &prop, 0) };
            if let Err(e) = check("cuMemCreate", r) {
                let total = pages * per_page * gran;
                let made = KvPages::release_handles(&gpu, &handles);
                return Err(Error::Request(format!(
                    "--kv-capacity {capacity}: {pages} pages of {positions} positions need {:.2} GiB of device memory \
                     ({made} chunks of {gran} bytes made): {e}",
                    total as f64 / (1u64 << 30) as f64
                )));
            }
            handles.push(h);
        }
        let pool = PagePool::bounded(positions, pages)?;
        Ok(KvPages { gpu, gran, per_page, handles, pool, positions, dtype, layers, max_len, row })
    }

    fn prop(gpu: &Gpu) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; every field the driver reads is set below, the rest zero.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = gpu.ctx.ordinal() as i32;
        prop
    }

    fn release_handles(gpu: &Gpu, handles: &[sys::CUmemGenericAllocationHandle]) -> usize {
        let _ = gpu.ctx.bind_to_thread();
        for &h in handles {
            // SAFETY: each handle came from cuMemCreate and is released once.
            let _ = unsafe { sys::cuMemRelease(h) };
        }
        handles.len()
    }

    /// What the scheduler admits by: these pages of this many positions.
    pub fn budget(&self) -> KvBudget {
        KvBudget { page: self.positions, pages: self.pool.total() }
    }

    /// Bytes of device memory the pages take.
    pub fn bytes(&self) -> usize {
        self.handles.len() * self.gran
    }

    /// Pages free now.
    pub fn free(&self) -> usize {
        self.pool.free()
    }

    /// A sequence's caches: address ranges for `max_len` positions of every buffer, nothing
    /// mapped yet.
    pub fn reserve(&self) -> Result<VirtualKv> {
        self.gpu.ctx.bind_to_thread().map_err(drv)?;
        // As many chunks as `max_len` positions take in whole pages (a page holds
        // ⌊gran / row_bytes⌋ positions, so when a row does not divide a chunk this is more than
        // the rows' bytes alone would need).
        let range_bytes = self.pool.pages_for(self.max_len).max(1) * self.gran;
        let mut seq = VirtualKv {
            gpu: self.gpu.clone(),
            gran: self.gran,
            caches: None,
            bases: Vec::with_capacity(self.per_page),
            range_bytes,
            pages: Pages::default(),
        };
        for _ in 0..self.per_page {
            let mut base: sys::CUdeviceptr = 0;
            // SAFETY: `base` is written on success; the range is freed in VirtualKv's Drop.
            check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut base, range_bytes, self.gran, 0, 0) })?;
            seq.bases.push(base);
        }
        let (s, n) = (&self.gpu.stream, self.max_len * self.row);
        let (k, v) = seq.bases.split_at(self.layers);
        seq.caches = Some(match self.dtype {
            // SAFETY: each range holds `range_len` elements; only mapped rows are ever touched
            // (see the module docs), and the slices are leaked, never freed, in Drop.
            KvDtype::F32 => KvCaches::F32 {
                k: k.iter().map(|&b| unsafe { s.upgrade_device_ptr::<f32>(b, n) }).collect(),
                v: v.iter().map(|&b| unsafe { s.upgrade_device_ptr::<f32>(b, n) }).collect(),
            },
            KvDtype::Bf16 => KvCaches::Bf16 {
                k: k.iter().map(|&b| unsafe { s.upgrade_device_ptr::<u16>(b, n) }).collect(),
                v: v.iter().map(|&b| unsafe { s.upgrade_device_ptr::<u16>(b, n) }).collect(),
            },
        });
        Ok(seq)
    }

    /// Maps pages into `seq` until it holds `positions` positions (an error, nothing mapped,
    /// when the pages are out: the scheduler's admission keeps that from happening).
    pub fn cover(&mut self, seq: &mut VirtualKv, positions: usize) -> Result<()> {
        let had = seq.pages.len();
        if self.pool.pages_for(positions) <= had {
            return Ok(());
        }
        if self.pool.pages_for(positions) * self.gran > seq.range_bytes {
            return Err(Error::Request(format!("paged K/V: {positions} positions past the sequence's range")));
        }
        self.pool.cover(&mut seq.pages, positions)?;
        self.gpu.ctx.bind_to_thread().map_err(drv)?;
        let access = sys::CUmemAccessDesc {
            location: Self::prop(&self.gpu).location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // Chunks mapped by this call, unmapped again if a later one fails (the pages go back).
        let mut mapped: Vec<sys::CUdeviceptr> = Vec::new();
        let mut map = |at: sys::CUdeviceptr, h| -> Result<()> {
            // SAFETY: `at .. at + gran` lies in the sequence's reserved range (checked above)
            // and is unmapped (pages past `had` were never mapped or were unmapped).
            check("cuMemMap", unsafe { sys::cuMemMap(at, self.gran, 0, h, 0) })?;
            mapped.push(at);
            check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(at, self.gran, &access, 1) })
        };
        let mut failed = None;
        'pages: for i in had..seq.pages.len() {
            let page = seq.pages.ids()[i] as usize;
            for (b, &base) in seq.bases.iter().enumerate() {
                if let Err(e) = map(base + (i * self.gran) as u64, self.handles[page * self.per_page + b]) {
                    failed = Some(e);
                    break 'pages;
                }
            }
        }
        let Some(e) = failed else { return Ok(()) };
        for at in mapped {
            // SAFETY: mapped just above; nothing has run on it.
            let _ = unsafe { sys::cuMemUnmap(at, self.gran) };
        }
        self.pool.shrink(&mut seq.pages, had * self.positions);
        Err(e)
    }

    /// Unmaps the pages of `seq` past those `positions` positions take, once the stream is idle.
    pub fn shrink(&mut self, seq: &mut VirtualKv, positions: usize) -> Result<()> {
        if self.pool.pages_for(positions) >= seq.pages.len() {
            return Ok(());
        }
        self.gpu.stream.synchronize().map_err(drv)?;
        let keep = self.pool.pages_for(positions);
        for i in keep..seq.pages.len() {
            for &base in &seq.bases {
                // SAFETY: page i of this range was mapped by `cover`; no work is in flight.
                check("cuMemUnmap", unsafe { sys::cuMemUnmap(base + (i * self.gran) as u64, self.gran) })?;
            }
        }
        self.pool.shrink(&mut seq.pages, positions);
        Ok(())
    }
}

impl Drop for KvPages {
    fn drop(&mut self) {
        let _ = self.gpu.stream.synchronize();
        KvPages::release_handles(&self.gpu, &self.handles);
    }
}

impl VirtualKv {
    /// The caches the kernels take.
    pub fn caches_mut(&mut self) -> &mut KvCaches {
        // Set in `reserve`, taken only in Drop.
        self.caches.get_or_insert(KvCaches::F32 { k: Vec::new(), v: Vec::new() })
    }

    /// Pages mapped.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// The caches, lent to an owner that wraps them (the draft's `LayerCaches`); they must come
    /// back through [`VirtualKv::put_caches`] before this is dropped, or cudarc would free
    /// memory it does not own.
    pub fn take_caches(&mut self) -> Option<KvCaches> {
        self.caches.take()
    }

    pub fn put_caches(&mut self, caches: KvCaches) {
        self.caches = Some(caches);
    }
}

impl Drop for VirtualKv {
    /// The slices are leaked (their memory is not cudarc's to free), any page still mapped is
    /// unmapped (its id is not returned: the batch is going away), and the ranges are freed.
    fn drop(&mut self) {
        let _ = self.gpu.stream.synchronize();
        let _ = self.gpu.ctx.bind_to_thread();
        for i in 0..self.pages.len() {
            for &base in &self.bases {
                // SAFETY: page i of this range is mapped; no work is in flight.
                let _ = unsafe { sys::cuMemUnmap(base + (i * self.gran) as u64, self.gran) };
            }
        }
        if let Some(c) = self.caches.take() {
            match c {
                KvCaches::F32 { k, v } => k.into_iter().chain(v).for_each(|s| {
                    s.leak();
                }),
                KvCaches::Bf16 { k, v } => k.into_iter().chain(v).for_each(|s| {
                    s.leak();
                }),
            }
        }
        for &base in &self.bases {
            // SAFETY: reserved by `KvPages::reserve` with this size, freed once.
            let _ = unsafe { sys::cuMemAddressFree(base, self.range_bytes) };
        }
    }
}
