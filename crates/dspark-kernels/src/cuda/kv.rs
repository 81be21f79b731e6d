//! KV cache buffers of either element type: f32, or bf16 (half the bytes per position).
//!
//! The caches are written by the fused norm + RoPE + append kernel and read by the attention
//! kernels; both exist for each element type (`qkv_rope_append_f32` /
//! `qkv_rope_append_f32_kvbf16`, `attention_split_q1_hd128_f32` / `…_f32_kvbf16`, …, see
//! `kernels/common.cuh` `KvElem`). Activations stay f32 either way: a bf16 cache rounds each
//! key (after k_norm and RoPE) and each value once, to the nearest bf16 with ties to even, as
//! [`crate::cpu::round_bf16`] does for the CPU reference, and the attention kernels widen the
//! values back to f32 exactly. bf16 is what transformers keeps for a bf16 model and what vLLM and
//! llama.cpp default to; f32 keeps the CPU reference's cache bit for bit.

use super::pdl::{device_addr, dptr, dptr_mut, Arg};
use super::Gpu;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

pub use crate::kv_dtype::KvDtype;

/// A read view of one layer's K or V cache (bf16 as raw u16).
pub enum KvView<'a> {
    F32(CudaView<'a, f32>),
    Bf16(CudaView<'a, u16>),
}

/// A write view of one layer's K or V cache.
pub enum KvViewMut<'a> {
    F32(CudaViewMut<'a, f32>),
    Bf16(CudaViewMut<'a, u16>),
}

impl KvView<'_> {
    pub fn dtype(&self) -> KvDtype {
        match self {
            KvView::F32(_) => KvDtype::F32,
            KvView::Bf16(_) => KvDtype::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvView::F32(s) => s.len(),
            KvView::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn arg(&self, gpu: &Gpu) -> Arg {
        match self {
            KvView::F32(s) => dptr(gpu, s),
            KvView::Bf16(s) => dptr(gpu, s),
        }
    }

    pub(crate) fn aligned16(&self, gpu: &Gpu) -> bool {
        match self {
            KvView::F32(s) => super::ops::aligned16(gpu, s),
            KvView::Bf16(s) => super::ops::aligned16(gpu, s),
        }
    }
}

impl KvViewMut<'_> {
    pub fn dtype(&self) -> KvDtype {
        match self {
            KvViewMut::F32(_) => KvDtype::F32,
            KvViewMut::Bf16(_) => KvDtype::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvViewMut::F32(s) => s.len(),
            KvViewMut::Bf16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn arg(&mut self, gpu: &Gpu) -> Arg {
        match self {
            KvViewMut::F32(s) => dptr_mut(gpu, s),
            KvViewMut::Bf16(s) => dptr_mut(gpu, s),
        }
    }
}

/// The K and V caches of a stack of layers, owned (the target's, allocated at load).
pub enum KvCaches {
    F32 { k: Vec<CudaSlice<f32>>, v: Vec<CudaSlice<f32>> },
    Bf16 { k: Vec<CudaSlice<u16>>, v: Vec<CudaSlice<u16>> },
}

impl KvCaches {
    pub fn dtype(&self) -> KvDtype {
        match self {
            KvCaches::F32 { .. } => KvDtype::F32,
            KvCaches::Bf16 { .. } => KvDtype::Bf16,
        }
    }

    pub fn layers(&self) -> usize {
        match self {
            KvCaches::F32 { k, v } => k.len().min(v.len()),
            KvCaches::Bf16 { k, v } => k.len().min(v.len()),
        }
    }

    /// Layer `l`'s K and V caches, whole.
    pub fn layer(&self, l: usize) -> Option<(KvView<'_>, KvView<'_>)> {
        match self {
            KvCaches::F32 { k, v } => Some((KvView::F32(k.get(l)?.as_view()), KvView::F32(v.get(l)?.as_view()))),
            KvCaches::Bf16 { k, v } => Some((KvView::Bf16(k.get(l)?.as_view()), KvView::Bf16(v.get(l)?.as_view()))),
        }
    }

    /// Every K cache's then every V cache's (length in values, device address), to `f` in that
    /// order: a visit rather than a list, so the check before every draft append allocates
    /// nothing.
    pub(crate) fn visit_lens_and_addrs(&self, gpu: &Gpu, mut f: impl FnMut(usize, u64)) {
        match self {
            KvCaches::F32 { k, v } => k.iter().chain(v).for_each(|c| f(c.len(), device_addr(gpu, c))),
            KvCaches::Bf16 { k, v } => k.iter().chain(v).for_each(|c| f(c.len(), device_addr(gpu, c))),
        }
    }

    /// The first K cache's device address (0 with no layers): names which caches a captured
    /// CUDA graph writes, so a model whose caches are swapped per sequence keys its graphs on it.
    pub fn addr(&self, gpu: &Gpu) -> u64 {
        match self {
            KvCaches::F32 { k, .. } => k.first().map_or(0, |c| device_addr(gpu, c)),
            KvCaches::Bf16 { k, .. } => k.first().map_or(0, |c| device_addr(gpu, c)),
        }
    }

    /// The same as a list.
    pub(crate) fn lens_and_addrs(&self, gpu: &Gpu) -> Vec<(usize, u64)> {
        let mut all = Vec::new();
        self.visit_lens_and_addrs(gpu, |len, addr| all.push((len, addr)));
        all
    }

    /// Layers of K and of V caches.
    pub(crate) fn counts(&self) -> (usize, usize) {
        match self {
            KvCaches::F32 { k, v } => (k.len(), v.len()),
            KvCaches::Bf16 { k, v } => (k.len(), v.len()),
        }
    }

    /// All layers' caches, lent to a forward.
    pub fn layers_mut(&mut self) -> LayersKv<'_> {
        match self {
            KvCaches::F32 { k, v } => LayersKv::F32(k, v),
            KvCaches::Bf16 { k, v } => LayersKv::Bf16(k, v),
        }
    }
}

/// The K and V caches of a stack of layers, borrowed for one forward (the target's
/// [`KvCaches`], or the draft's f32 caches in `kv_layers::LayerCaches`).
pub enum LayersKv<'a> {
    F32(&'a mut [CudaSlice<f32>], &'a mut [CudaSlice<f32>]),
    Bf16(&'a mut [CudaSlice<u16>], &'a mut [CudaSlice<u16>]),
}

impl LayersKv<'_> {
    /// Layers with both a K and a V cache.
    pub fn layers(&self) -> usize {
        match self {
            LayersKv::F32(k, v) => k.len().min(v.len()),
            LayersKv::Bf16(k, v) => k.len().min(v.len()),
        }
    }

    /// Layer `l`'s K and V caches whole, to append to (`l < layers()`).
    /// Layer `l`'s K and V caches as (K address, V address, values each): the entries of a
    /// segmented launch's table (`attention_seg.rs`).
    pub fn layer_addrs(&self, gpu: &Gpu, l: usize) -> Option<(u64, u64, usize)> {
        match self {
            LayersKv::F32(k, v) => {
                Some((device_addr(gpu, k.get(l)?), device_addr(gpu, v.get(l)?), k[l].len().min(v[l].len())))
            }
            LayersKv::Bf16(k, v) => {
                Some((device_addr(gpu, k.get(l)?), device_addr(gpu, v.get(l)?), k[l].len().min(v[l].len())))
            }
        }
    }

    /// The caches' element type.
    pub fn dtype(&self) -> KvDtype {
        match self {
            LayersKv::F32(..) => KvDtype::F32,
            LayersKv::Bf16(..) => KvDtype::Bf16,
        }
    }

    pub fn append_views(&mut self, l: usize) -> (KvViewMut<'_>, KvViewMut<'_>) {
        match self {
            LayersKv::F32(k, v) => (KvViewMut::F32(k[l].slice_mut(..)), KvViewMut::F32(v[l].slice_mut(..))),
            LayersKv::Bf16(k, v) => (KvViewMut::Bf16(k[l].slice_mut(..)), KvViewMut::Bf16(v[l].slice_mut(..))),
        }
    }

    /// The first `values` values of layer `l`'s K and V caches, to attend over.
    pub fn read_views(&self, l: usize, values: usize) -> (KvView<'_>, KvView<'_>) {
        match self {
            LayersKv::F32(k, v) => (KvView::F32(k[l].slice(..values)), KvView::F32(v[l].slice(..values))),
            LayersKv::Bf16(k, v) => (KvView::Bf16(k[l].slice(..values)), KvView::Bf16(v[l].slice(..values))),
        }
    }
}
