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

use super::ops::StepLens;
use super::pdl::{device_addr, dptr, Arg};
use super::{CudaError, CudaResult, Gpu};
use cudarc::driver::{CudaSlice, CudaView};

/// The K and V caches of a stack of layers, each `[rows, nkv·hd]` f32, with the device arrays
/// of their addresses that `kv_rope_append_layers_f32` reads. [`LayerCaches::caches_mut`] lends
/// the buffers out (the layer steps write them too), and a buffer swapped for another through it
/// would leave a stale address behind: every launch first checks the buffers against the
/// addresses and lengths it recorded, and refuses to run on a mismatch.
pub struct LayerCaches {
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
    k_ptrs: CudaSlice<u64>,
    v_ptrs: CudaSlice<u64>,
    /// The addresses written to `k_ptrs` / `v_ptrs`, kept on the host for that check.
    addrs: Vec<u64>,
    /// Floats per cache row (nkv · hd), and per cache.
    row_len: usize,
    len: usize,
}

impl LayerCaches {
    /// Takes the layers' caches (equal lengths, whole rows of `row_len` floats) and two buffers
    /// of at least `layers` elements for their addresses, which it fills.
    pub fn new(
        gpu: &Gpu,
        k: Vec<CudaSlice<f32>>,
        v: Vec<CudaSlice<f32>>,
        (mut k_ptrs, mut v_ptrs): (CudaSlice<u64>, CudaSlice<u64>),
        row_len: usize,
    ) -> CudaResult<LayerCaches> {
        let len = k.first().map_or(0, CudaSlice::len);
        if k.len() != v.len()
            || k.iter().chain(&v).any(|c| c.len() != len)
            || row_len == 0
            || !len.is_multiple_of(row_len)
        {
            return Err(CudaError::Shape(format!(
                "layer caches: {} K and {} V buffers, each must hold the same whole number of {row_len}-float rows",
                k.len(),
                v.len()
            )));
        }
        if k_ptrs.len() < k.len() || v_ptrs.len() < v.len() {
            return Err(CudaError::Shape(format!(
                "layer caches: address buffers of {} / {} for {} layers",
                k_ptrs.len(),
                v_ptrs.len(),
                k.len()
            )));
        }
        let addrs: Vec<u64> = k.iter().chain(&v).map(|c| device_addr(gpu, c)).collect();
        let n = k.len();
        gpu.stream.memcpy_htod(&addrs[..n], &mut k_ptrs.slice_mut(..n))?;
        gpu.stream.memcpy_htod(&addrs[n..], &mut v_ptrs.slice_mut(..n))?;
        Ok(LayerCaches { k, v, k_ptrs, v_ptrs, addrs, row_len, len })
    }

    /// The K and V caches, for the layer steps that read and write them.
    pub fn caches_mut(&mut self) -> (&mut [CudaSlice<f32>], &mut [CudaSlice<f32>]) {
        (&mut self.k, &mut self.v)
    }

    /// Layer `l`'s K and V caches.
    pub fn layer(&self, l: usize) -> Option<(&CudaSlice<f32>, &CudaSlice<f32>)> {
        Some((self.k.get(l)?, self.v.get(l)?))
    }

    /// Whether every buffer is still the one whose address the kernel will read.
    fn unchanged(&self, gpu: &Gpu) -> bool {
        self.k.iter().chain(&self.v).zip(&self.addrs).all(|(c, &a)| c.len() == self.len && device_addr(gpu, c) == a)
    }

    pub fn layers(&self) -> usize {
        self.k.len()
    }

    /// Rows each layer's cache holds.
    pub fn rows(&self) -> usize {
        self.k.first().map_or(0, |c| c.len() / self.row_len)
    }
}

impl Gpu {
    /// `rows` rows of `kv` (`[rows, layers, 2·nkv, hd]`: each layer's k heads, then its v heads)
    /// into cache rows `first_pos ..` of every layer of `caches`: k normalised with that layer's
    /// row of `k_norm` (`[layers, hd]`) and rotated by `inv_freq` (`[hd/2]`), v copied.
    pub fn kv_rope_append_layers(
        &self,
        kv: &CudaView<f32>,
        (k_norm, inv_freq): (&CudaView<f32>, &CudaView<f32>),
        caches: &mut LayerCaches,
        (rows, nkv): (usize, usize),
        lens: &StepLens<'_>,
        eps: f32,
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
        // kv_rope_append_layers_f32(kv, k_norm, inv_freq, k_caches, v_caches, layers, nkv, hd,
        // lens, eps); lengths checked above, the address arrays filled by LayerCaches::new.
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
        ];
        self.launch_pdl("kv_rope_append_layers_f32", ((rows * layers * 2 * nkv) as u32, 1, 1), threads, &args)
    }
}
