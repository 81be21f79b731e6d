//! Appending one set of rows to the K/V caches of several layers in one launch.
//!
//! The DSpark draft projects each committed context row into the keys and values of all of its
//! layers: the same input row, each layer's k_proj|v_proj (DSPARK.md §2.2). One matvec over the
//! layers' k|v rows stacked (`[layers · 2·kv, H]`) and one norm + RoPE + append launch
//! (`kv_rope_append_layers_f32`, kernels/rope.cu) replace a matvec and an append per layer: the
//! five 16.8 MB projections of DSpark-8B each ran at about a third of the copy ceiling, where a
//! single 84 MB one runs near it. The kernel finds each layer's caches through device arrays of
//! pointers, so [`LayerCaches`] owns the caches together with those arrays: a pointer can only
//! be read while the buffer it points at is alive.

use super::kv::{KvCaches, KvDtype, KvView, LayersKv};
use super::ops::StepLens;
use super::pdl::{dptr, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaSlice, CudaView};

/// The K and V caches of a stack of layers, each `[rows, nkv·hd]` (f32 or bf16, [`KvCaches`]),
/// with the device arrays of their addresses that `kv_rope_append_layers_f32[_kvbf16]` reads. [`LayerCaches::caches_mut`] lends
/// the buffers out (the layer steps write them too), and a buffer swapped for another through it
/// would leave a stale address behind: every launch first checks the buffers against the
/// addresses and lengths it recorded, and refuses to run on a mismatch.
pub struct LayerCaches {
    caches: KvCaches,
    k_ptrs: CudaSlice<u64>,
    v_ptrs: CudaSlice<u64>,
    /// Each cache's length and the address written to `k_ptrs` / `v_ptrs`, kept on the host
    /// for that check.
    recorded: Vec<(usize, u64)>,
    /// Values per cache row (nkv · hd), and per cache.
    row_len: usize,
    len: usize,
}

impl LayerCaches {
    /// Takes the layers' caches (equal lengths, whole rows of `row_len` values) and two buffers
    /// of at least `layers` elements for their addresses, which it fills.
    pub fn new(
        gpu: &Gpu,
        caches: KvCaches,
        (mut k_ptrs, mut v_ptrs): (CudaSlice<u64>, CudaSlice<u64>),
        row_len: usize,
    ) -> CudaResult<LayerCaches> {
        let (nk, nv) = caches.counts();
        let recorded = caches.lens_and_addrs(gpu);
        let len = recorded.first().map_or(0, |r| r.0);
        if nk != nv || recorded.iter().any(|r| r.0 != len) || row_len == 0 || !len.is_multiple_of(row_len) {
            return Err(CudaError::Shape(format!(
                "layer caches: {nk} K and {nv} V buffers, each must hold the same whole number of {row_len}-value rows"
            )));
        }
        if k_ptrs.len() < nk || v_ptrs.len() < nv {
            return Err(CudaError::Shape(format!(
                "layer caches: address buffers of {} / {} for {nk} layers",
                k_ptrs.len(),
                v_ptrs.len()
            )));
        }
        let addrs: Vec<u64> = recorded.iter().map(|r| r.1).collect();
        gpu.stream.memcpy_htod(&addrs[..nk], &mut k_ptrs.slice_mut(..nk))?;
        gpu.stream.memcpy_htod(&addrs[nk..], &mut v_ptrs.slice_mut(..nk))?;
        Ok(LayerCaches { caches, k_ptrs, v_ptrs, recorded, row_len, len })
    }

    /// The caches themselves, the address buffers dropped (memory the caches do not own — a
    /// paged range — goes back to its owner this way).
    pub fn into_caches(self) -> KvCaches {
        self.caches
    }

    /// The K and V caches, for the layer steps that read and write them.
    pub fn caches_mut(&mut self) -> LayersKv<'_> {
        self.caches.layers_mut()
    }

    /// The first K cache's device address (a graph's key: which caches it writes).
    pub fn addr(&self) -> u64 {
        self.recorded.first().map_or(0, |r| r.1)
    }

    /// Layer `l`'s K and V caches.
    pub fn layer(&self, l: usize) -> Option<(KvView<'_>, KvView<'_>)> {
        self.caches.layer(l)
    }

    pub fn dtype(&self) -> KvDtype {
        self.caches.dtype()
    }

    /// Whether every buffer is still the one whose address the kernel will read.
    fn unchanged(&self, gpu: &Gpu) -> bool {
        let (mut seen, mut same) = (0, true);
        self.caches.visit_lens_and_addrs(gpu, |len, addr| {
            same &= self.recorded.get(seen) == Some(&(len, addr));
            seen += 1;
        });
        same && seen == self.recorded.len()
    }

    pub fn layers(&self) -> usize {
        self.caches.layers()
    }

    /// Rows each layer's cache holds.
    pub fn rows(&self) -> usize {
        self.len / self.row_len
    }
}

/// How the rows handed to [`Gpu::kv_rope_append_layers`] are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvRowsLayout {
    /// `[rows, layers, 2·nkv, hd]`: the output of one projection over every layer's k|v rows
    /// stacked.
    TokenMajor,
    /// `[layers, rows, 2·nkv, hd]`: one projection per layer, each over a view of that layer's
    /// own k|v rows (no stacked copy held).
    LayerMajor,
}

impl Gpu {
    /// `rows` rows of `kv` (`[rows, layers, 2·nkv, hd]`: each layer's k heads, then its v heads;
    /// or layer by layer, `layout`)
    /// into cache rows `first_pos ..` of every layer of `caches`: k normalised with that layer's
    /// row of `k_norm` (`[layers, hd]`) and rotated by `inv_freq` (`[hd/2]`), v copied.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_rope_append_layers(
        &self,
        kv: &CudaView<f32>,
        (k_norm, inv_freq): (&CudaView<f32>, &CudaView<f32>),
        caches: &mut LayerCaches,
        (rows, nkv): (usize, usize),
        lens: &StepLens<'_>,
        eps: f32,
        layout: KvRowsLayout,
    ) -> CudaResult<()> {
        if !caches.unchanged(self) {
            return Err(CudaError::Shape(
                "kv_rope_append_layers: a layer cache was replaced after LayerCaches recorded its address".into(),
            ));
        }
        let layers = caches.layers();
        let hd = inv_freq.len() * 2;
        if layers == 0 || hd == 0 || hd > 512 || k_norm.len() != layers * hd || caches.row_len != nkv * hd {
            return Err(CudaError::Shape(format!(
                "kv_rope_append_layers: {layers} layers, head_dim {hd} (from {} frequencies), k_norm of {}, \
                 cache rows of {} floats for {nkv} KV heads",
                inv_freq.len(),
                k_norm.len(),
                caches.row_len
            )));
        }
        super::ops::check("kv_rope_append_layers kv", kv.len(), rows * layers * 2 * nkv * hd)?;
        super::ops::check("kv_rope_append_layers cache rows", caches.rows(), lens.first_pos + rows)?;
        super::ops::check("kv_rope_append_layers lens", lens.dev.len(), 1)?;
        let threads = ((hd / 2).div_ceil(32) * 32) as u32;
        // kv_rope_append_layers_f32[_kvbf16](kv, k_norm, inv_freq, k_caches, v_caches, layers,
        // nkv, hd, lens, eps, layer_major); lengths checked above, the address arrays filled by
        // LayerCaches::new.
        let args = [
            dptr(self, kv),
            dptr(self, k_norm),
            dptr(self, inv_freq),
            dptr(self, &caches.k_ptrs),
            dptr(self, &caches.v_ptrs),
            Arg::I32(layers as i32),
            Arg::I32(nkv as i32),
            Arg::I32(hd as i32),
            dptr(self, &lens.dev),
            Arg::F32(eps),
            Arg::I32(i32::from(layout == KvRowsLayout::LayerMajor)),
        ];
        let name = format!("kv_rope_append_layers_f32{}", caches.dtype().kernel_suffix());
        self.launch_pdl(&name, ((rows * layers * 2 * nkv) as u32, 1, 1), threads, &args)
    }
}
