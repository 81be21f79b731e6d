//! Gather-only tables in mapped host memory, and the embedding lookup that reads either kind.
//!
//! The token embedding `[vocab, hidden]` is the largest matrix a forward does not stream: a step
//! reads one row per token (8 KB for Qwen3-8B), yet the table holds 1.24 GB of device memory, as
//! much as the KV cache of 8,000 positions. On a 12 GB card that decides whether Qwen3-8B-FP8 and
//! its draft fit at all. So the table may live in page-locked host memory mapped into the device's
//! address space (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP`), and the embedding kernel
//! reads its rows over PCIe, as llama.cpp keeps `token_embd` on the host. The kernel
//! (`embedding_*`, kernels/embedding.cu, the device table's) issues every 16-byte load of a row
//! before it uses one, so a row costs about one PCIe round trip (~1–2 µs) rather than one per loop iteration; a
//! decode step gathers 1–8 rows, a prefill chunk of 2,048 rows 16 MB (~0.3 ms at PCIe 5).
//!
//! The bytes are the checkpoint's, unchanged, so a host table gives the same bits as the device
//! table (a GPU test compares them). A tied head (`tie_word_embeddings`) streams the table as
//! `lm_head` every step, so it never goes to the host (the model's loader refuses).

use super::ops::WeightBuf;
use super::pdl::{dptr, dptr_mut, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{sys, CudaContext, CudaView, CudaViewMut, PinnedHostSlice};
use std::sync::Arc;

/// A `[rows, cols]` table in mapped, page-locked host memory, in the checkpoint's dtype.
pub struct HostTable {
    /// Keeps the allocation alive; freed (after the context's work) when dropped.
    _mem: PinnedHostSlice<u8>,
    /// The device's address of the same bytes.
    device_ptr: u64,
    suffix: &'static str,
    elem_bytes: usize,
    len: usize,
}

impl std::fmt::Debug for HostTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostTable({} × {}, {} bytes)", self.len, self.suffix, self.bytes())
    }
}

impl HostTable {
    /// Copies `bytes` (little-endian elements of `suffix`: `bf16`, `f16` or `f32`) into a new
    /// mapped host allocation of `ctx`.
    pub fn from_bytes(ctx: &Arc<CudaContext>, suffix: &str, bytes: &[u8]) -> CudaResult<HostTable> {
        let mut t = Self::zeroed(ctx, suffix, bytes.len())?;
        t.host_mut()?.copy_from_slice(bytes);
        Ok(t)
    }

    /// A table of `n_bytes` bytes (zeroed) to be filled through [`HostTable::host_mut`].
    pub fn zeroed(ctx: &Arc<CudaContext>, suffix: &str, n_bytes: usize) -> CudaResult<HostTable> {
        let (suffix, elem_bytes) = match suffix {
            "bf16" => ("bf16", 2),
            "f16" => ("f16", 2),
            "f32" => ("f32", 4),
            other => return Err(CudaError::Shape(format!("host table: no host gather for {other} elements"))),
        };
        if n_bytes == 0 || !n_bytes.is_multiple_of(elem_bytes) {
            return Err(CudaError::Shape(format!("host table: {n_bytes} bytes is not a table of {suffix}")));
        }
        // SAFETY: the memory is zeroed below, before anything reads it.
        let mut mem = unsafe {
            ctx.alloc_pinned_with_flags::<u8>(n_bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .map_err(CudaError::Driver)?;
        let host = mem.as_mut_slice().map_err(CudaError::Driver)?;
        host.fill(0);
        let ptr = host.as_mut_ptr();
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is the start of a live allocation made with DEVICEMAP in this context,
        // which the returned struct keeps alive; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, ptr as *mut _, 0) }
            .result()
            .map_err(CudaError::Driver)?;
        Ok(HostTable { _mem: mem, device_ptr, suffix, elem_bytes, len: n_bytes / elem_bytes })
    }

    /// The table's bytes on the host, to fill before the device reads them.
    pub fn host_mut(&mut self) -> CudaResult<&mut [u8]> {
        self._mem.as_mut_slice().map_err(CudaError::Driver)
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of host memory held.
    pub fn bytes(&self) -> usize {
        self.len * self.elem_bytes
    }

    /// The element type's kernel suffix (`bf16`, `f16`, `f32`).
    pub fn suffix(&self) -> &'static str {
        self.suffix
    }
}

/// An embedding table a model owns: a device weight (which a tied head also streams), or a mapped
/// host table.
pub enum Table {
    Device(Arc<WeightBuf>),
    Host(HostTable),
}

impl Table {
    /// The device weight, when the table is one.
    pub fn device(&self) -> Option<&Arc<WeightBuf>> {
        match self {
            Table::Device(w) => Some(w),
            Table::Host(_) => None,
        }
    }

    /// Bytes of device memory the table holds (0 on the host).
    pub fn device_bytes(&self) -> usize {
        self.device().map_or(0, |w| w.bytes())
    }

    /// Bytes of the table wherever it lives.
    pub fn bytes(&self) -> usize {
        match self {
            Table::Device(w) => w.bytes(),
            Table::Host(t) => t.bytes(),
        }
    }
}

impl<'a> From<&'a Table> for TableRef<'a> {
    fn from(t: &'a Table) -> Self {
        match t {
            Table::Device(w) => TableRef::Device(w),
            Table::Host(h) => TableRef::Host(h),
        }
    }
}

/// Where an embedding table lives: a device weight, or a mapped host table.
#[derive(Clone, Copy)]
pub enum TableRef<'a> {
    Device(&'a WeightBuf),
    Host(&'a HostTable),
}

impl TableRef<'_> {
    /// Elements of the table.
    pub fn len(&self) -> usize {
        match self {
            TableRef::Device(w) => w.len(),
            TableRef::Host(t) => t.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type's kernel suffix (`bf16`, `f16`, `f32`; `fp8` for an FP8 weight, which
    /// no gather takes).
    pub fn suffix(&self) -> &'static str {
        match self {
            TableRef::Device(w) => w.suffix(),
            TableRef::Host(t) => t.suffix,
        }
    }

    /// The table's address as a kernel argument: a mapped host table's is the device's view of
    /// it, which plain loads read over PCIe like any global address.
    pub(crate) fn arg(&self, gpu: &Gpu) -> Arg {
        Arg::Ptr(self.addr(gpu))
    }

    /// The table's raw address (the fused chain's epilogue arguments take it so).
    pub(crate) fn addr(&self, gpu: &Gpu) -> u64 {
        use super::pdl::device_addr;
        match self {
            TableRef::Device(WeightBuf::Bf16(s) | WeightBuf::F16(s)) => device_addr(gpu, s),
            TableRef::Device(WeightBuf::F32(s)) => device_addr(gpu, s),
            TableRef::Device(WeightBuf::Fp8(f)) => device_addr(gpu, &f.q),
            TableRef::Host(t) => t.device_ptr,
        }
    }
}

impl<'a> From<&'a WeightBuf> for TableRef<'a> {
    fn from(w: &'a WeightBuf) -> Self {
        TableRef::Device(w)
    }
}

impl<'a> From<&'a HostTable> for TableRef<'a> {
    fn from(t: &'a HostTable) -> Self {
        TableRef::Host(t)
    }
}

impl Gpu {
    /// `out[r, :] = table[ids[r], :]`; table `[vocab, dim]`, on the device or the host.
    pub fn embedding<'t>(
        &self,
        table: impl Into<TableRef<'t>>,
        dim: usize,
        ids: &CudaView<u32>,
        rows: usize,
        out: &mut CudaViewMut<f32>,
    ) -> CudaResult<()> {
        super::ops::check("embedding ids", ids.len(), rows)?;
        super::ops::check("embedding out", out.len(), rows * dim)?;
        // embedding_*(table, ids, out, dim)
        let (table, name) = match table.into() {
            TableRef::Device(w) => (super::ops::wptr(self, &w.view(0..w.len())), format!("embedding_{}", w.suffix())),
            TableRef::Host(t) => {
                // 16-byte loads of whole rows: a row must be a whole number of them.
                if dim == 0 || !(dim * t.elem_bytes).is_multiple_of(16) || !t.len.is_multiple_of(dim) {
                    return Err(CudaError::Shape(format!(
                        "embedding: a host table's rows must be whole 16-byte chunks ({dim} {} values, table of {})",
                        t.suffix, t.len
                    )));
                }
                (Arg::Ptr(t.device_ptr), format!("embedding_{}", t.suffix))
            }
        };
        let args = [table, dptr(self, ids), dptr_mut(self, out), Arg::I32(dim as i32)];
        self.launch_pdl(&name, (rows as u32, 1, 1), 256, &args)
    }
}
