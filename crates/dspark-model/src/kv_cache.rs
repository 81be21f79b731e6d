//! Key/value cache of the CPU reference path.
//!
//! Per layer, keys and values are stored position-major, `[position, kv_head, head_dim]`, so
//! appending new positions is a `extend_from_slice` and rolling back after a rejected verify is
//! a `truncate`. Keys are stored after k_norm and RoPE, exactly as attention consumes them.

/// Append-and-truncate KV storage for every layer.
#[derive(Clone, Debug)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Values per position per layer (`n_kv_heads · head_dim`).
    row: usize,
    len: usize,
}

impl KvCache {
    pub fn new(layers: usize, row: usize) -> KvCache {
        KvCache { k: vec![Vec::new(); layers], v: vec![Vec::new(); layers], row, len: 0 }
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
        self.k[layer].extend_from_slice(k);
        self.v[layer].extend_from_slice(v);
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
