//! Key/value cache of the CPU reference path.
//!
//! Per layer, keys and values are stored position-major, `[position, kv_head, head_dim]`, so
//! appending new positions is a `extend_from_slice` and rolling back after a rejected verify is
//! a `truncate`. Keys are stored after k_norm and RoPE, exactly as attention consumes them.
//! With [`KvDtype::Bf16`] every appended value is rounded to the nearest bf16 (kept widened in
//! f32), as the GPU's bf16 caches store it, so the CPU path is their reference too.

use dspark_kernels::KvDtype;

/// Append-and-truncate KV storage for every layer.
#[derive(Clone, Debug)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Values per position per layer (`n_kv_heads · head_dim`).
    row: usize,
    len: usize,
    dtype: KvDtype,
}

impl KvCache {
    pub fn new(layers: usize, row: usize) -> KvCache {
        Self::with_dtype(layers, row, KvDtype::F32)
    }

    /// A cache whose values are rounded to `dtype` as they are appended.
    pub fn with_dtype(layers: usize, row: usize, dtype: KvDtype) -> KvCache {
        KvCache { k: vec![Vec::new(); layers], v: vec![Vec::new(); layers], row, len: 0, dtype }
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Committed positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `k` and `v` (`[n, row]` each) to `layer`. Every layer must receive the same
    /// number of rows before [`KvCache::commit`] advances the length.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        debug_assert_eq!(k.len() % self.row, 0);
        debug_assert_eq!(k.len(), v.len());
        let keep = |x: &f32| self.dtype.keep(*x);
        self.k[layer].extend(k.iter().map(keep));
        self.v[layer].extend(v.iter().map(keep));
    }

    /// Keys and values of `layer`, including rows appended since the last commit.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }

    /// Marks `n` appended rows as committed.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.k.iter().all(|k| k.len() == self.len * self.row));
    }

    /// Keeps positions `0..len`.
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        for (k, v) in self.k.iter_mut().zip(&mut self.v) {
            k.truncate(len * self.row);
            v.truncate(len * self.row);
        }
        self.len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::{KvCache, KvDtype};

    #[test]
    fn bf16_cache_rounds_what_it_appends_and_f32_keeps_it() {
        let k = [1.0f32 + 1.0 / 512.0, -std::f32::consts::PI, 0.1];
        let v = [2.0f32, 1.0e-3, -7.77];
        let mut f = KvCache::new(1, 3);
        let mut b = KvCache::with_dtype(1, 3, KvDtype::Bf16);
        f.append(0, &k, &v);
        b.append(0, &k, &v);
        assert_eq!(f.layer(0), (&k[..], &v[..]));
        let (bk, bv) = b.layer(0);
        for (got, want) in bk.iter().chain(bv).zip(k.iter().chain(&v)) {
            assert_eq!(*got, half::bf16::from_f32(*want).to_f32());
            assert!((got - want).abs() <= want.abs() / 256.0, "{got} vs {want}: within half a bf16 ulp");
        }
        assert_ne!(bk[1], k[1], "π is not a bf16 value");
    }
}
