//! Key/value cache of the CPU reference path, in pages (`kv_pages`).
//!
//! Per layer, keys and values live in pages of `page` positions, each position a row
//! `[kv_head, head_dim]`; a sequence's page table says where its positions are. Keys are stored
//! after k_norm and RoPE, exactly as attention consumes them, which reads them through the table
//! ([`dspark_kernels::cpu::attention::Paged`]: the same bits as a contiguous cache). With
//! [`KvDtype::Bf16`] every appended value is rounded to the nearest bf16 (kept widened in f32),
//! as the GPU's bf16 caches store it, so the CPU path is their reference too.
//!
//! One [`KvCache`] is the storage of every sequence a model holds; the sequence being run is
//! its [`KvSeq`] (page table and length), which `batch::Sequences` swaps in and out. A cache made
//! by [`KvCache::new`] grows a page at a time as before paging; [`KvCache::bounded`] plans its
//! pages once (`--kv-capacity`) and refuses to grow past them. Rolling back frees the whole
//! pages past the new length; a closed sequence frees all of its own. Debug builds fill freed
//! pages with NaN, so a read of a position that was never (re)written shows in every test.

use crate::batch::KvBudget;
use crate::kv_pages::{PagePool, Pages, DEFAULT_PAGE};
use crate::Result;
use dspark_kernels::cpu::attention::Paged;
use dspark_kernels::KvDtype;

/// One sequence's view of a [`KvCache`]: its pages and its committed positions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvSeq {
    pages: Pages,
    len: usize,
}

/// Paged K/V storage of every layer for the sequences of one model (see the module docs).
#[derive(Clone, Debug)]
pub struct KvCache {
    /// Per layer, `[pages, page, row]`.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Values per position per layer (`n_kv_heads · head_dim`).
    row: usize,
    dtype: KvDtype,
    pool: PagePool,
    /// The sequence being run.
    seq: KvSeq,
    /// Rows each layer has appended since the last commit.
    appended: Vec<usize>,
}

impl KvCache {
    /// A growable f32 cache.
    pub fn new(layers: usize, row: usize) -> KvCache {
        Self::with_dtype(layers, row, KvDtype::F32)
    }

    /// A growable cache whose values are rounded to `dtype` as they are appended.
    pub fn with_dtype(layers: usize, row: usize, dtype: KvDtype) -> KvCache {
        // DEFAULT_PAGE is within the sizes growable() takes, so it cannot fail here.
        let pool = PagePool::growable(DEFAULT_PAGE).unwrap_or_else(|_| unreachable!("DEFAULT_PAGE is valid"));
        Self::with_pool(layers, row, dtype, pool)
    }

    /// A cache of exactly `pages` pages of `page` positions, its storage allocated now.
    pub fn bounded(layers: usize, row: usize, dtype: KvDtype, page: usize, pages: usize) -> Result<KvCache> {
        let pool = PagePool::bounded(page, pages)?;
        let mut c = Self::with_pool(layers, row, dtype, pool);
        c.grow_storage();
        Ok(c)
    }

    fn with_pool(layers: usize, row: usize, dtype: KvDtype, pool: PagePool) -> KvCache {
        let (k, v) = (vec![Vec::new(); layers], vec![Vec::new(); layers]);
        KvCache { k, v, row, dtype, pool, seq: KvSeq::default(), appended: vec![0; layers] }
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// The pool's pages: (positions a page holds, pages free, pages in all).
    pub fn pages(&self) -> (usize, usize, usize) {
        (self.pool.page(), self.pool.free(), self.pool.total())
    }

    /// Bytes the storage takes now (f32 values, keys and values of every layer).
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|b| b.len() * std::mem::size_of::<f32>()).sum()
    }

    /// The pages all sequences share, when they were planned once (`--kv-capacity`).
    pub fn budget(&self) -> Option<KvBudget> {
        self.pool.is_bounded().then_some(KvBudget { page: self.pool.page(), pages: self.pool.total() })
    }

    /// Committed positions of the current sequence.
    pub fn len(&self) -> usize {
        self.seq.len
    }

    pub fn is_empty(&self) -> bool {
        self.seq.len == 0
    }

    /// Makes room for `n` more positions of the current sequence (an error when a bounded cache
    /// is out of pages); call before appending them.
    pub fn reserve(&mut self, n: usize) -> Result<()> {
        self.pool.cover(&mut self.seq.pages, self.seq.len + n)?;
        self.grow_storage();
        Ok(())
    }

    /// Storage for every page the pool has (a growable pool adds pages).
    fn grow_storage(&mut self) {
        let size = self.pool.total() * self.pool.page() * self.row;
        for buf in self.k.iter_mut().chain(&mut self.v) {
            if buf.len() < size {
                buf.resize(size, f32::NAN);
            }
        }
    }

    /// Appends `k` and `v` (`[n, row]` each) to `layer` after the rows appended to it since the
    /// last commit; [`KvCache::reserve`] made room for them. Every layer must receive the same
    /// rows before [`KvCache::commit`] advances the length.
    pub fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        debug_assert_eq!(k.len() % self.row, 0);
        debug_assert_eq!(k.len(), v.len());
        let (page, row, dtype) = (self.pool.page(), self.row, self.dtype);
        let first = self.seq.len + self.appended[layer];
        for (i, (kr, vr)) in k.chunks_exact(row).zip(v.chunks_exact(row)).enumerate() {
            let pos = first + i;
            let at = Paged::slot(self.seq.pages.ids(), page, pos) * row;
            for (dst, x) in self.k[layer][at..at + row].iter_mut().zip(kr) {
                *dst = dtype.keep(*x);
            }
            for (dst, x) in self.v[layer][at..at + row].iter_mut().zip(vr) {
                *dst = dtype.keep(*x);
            }
        }
        self.appended[layer] += k.len() / row;
    }

    /// Keys and values of `layer`, rows appended since the last commit included, as attention
    /// reads them.
    pub fn layer(&self, layer: usize) -> (Paged<'_>, Paged<'_>) {
        let (pages, page, row) = (self.seq.pages.ids(), self.pool.page(), self.row);
        (Paged { data: &self.k[layer], pages, page, row }, Paged { data: &self.v[layer], pages, page, row })
    }

    /// Positions `0..n` of `layer`'s keys and values, copied out contiguously into vectors with
    /// room for `extra` more rows (the caller's own, appended without a reallocation).
    pub fn gather(&self, layer: usize, n: usize, extra: usize) -> (Vec<f32>, Vec<f32>) {
        use dspark_kernels::cpu::attention::KvRows;
        let (k, v) = self.layer(layer);
        let cap = (n + extra) * self.row;
        let mut out = (Vec::with_capacity(cap), Vec::with_capacity(cap));
        for j in 0..n {
            out.0.extend_from_slice(k.row(j));
            out.1.extend_from_slice(v.row(j));
        }
        out
    }

    /// Marks `n` appended rows as committed.
    pub fn commit(&mut self, n: usize) {
        debug_assert!(self.appended.iter().all(|&a| a == n), "every layer appends the committed rows");
        self.seq.len += n;
        self.appended.iter_mut().for_each(|a| *a = 0);
    }

    /// Keeps positions `0..len` (and any uncommitted rows are dropped), freeing the pages past
    /// them.
    pub fn truncate(&mut self, len: usize) {
        self.seq.len = len.min(self.seq.len);
        self.appended.iter_mut().for_each(|a| *a = 0);
        let freed = self.pool.shrink(&mut self.seq.pages, self.seq.len);
        self.poison(&freed);
    }

    /// A new, empty sequence's view (it takes pages as it grows).
    pub fn new_seq(&self) -> KvSeq {
        KvSeq::default()
    }

    /// Exchanges the current sequence with `seq`.
    pub fn swap_seq(&mut self, seq: &mut KvSeq) {
        std::mem::swap(&mut self.seq, seq);
        self.appended.iter_mut().for_each(|a| *a = 0);
    }

    /// Frees a closed sequence's pages.
    pub fn release_seq(&mut self, seq: KvSeq) {
        let freed = self.pool.release(seq.pages);
        self.poison(&freed);
    }

    /// Debug builds: fills freed pages with NaN (a later read of them before a write shows).
    fn poison(&mut self, pages: &[u32]) {
        if cfg!(debug_assertions) {
            let size = self.pool.page() * self.row;
            for buf in self.k.iter_mut().chain(&mut self.v) {
                for &p in pages {
                    buf[p as usize * size..][..size].fill(f32::NAN);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KvCache, KvDtype};
    use dspark_kernels::cpu::attention::KvRows;

    #[test]
    fn bf16_cache_rounds_what_it_appends_and_f32_keeps_it() {
        let k = [1.0f32 + 1.0 / 512.0, -std::f32::consts::PI, 0.1];
        let v = [2.0f32, 1.0e-3, -7.77];
        let mut f = KvCache::new(1, 3);
        let mut b = KvCache::with_dtype(1, 3, KvDtype::Bf16);
        for c in [&mut f, &mut b] {
            assert!(c.reserve(1).is_ok());
            c.append(0, &k, &v);
            c.commit(1);
        }
        assert_eq!(f.gather(0, 1, 0), (k.to_vec(), v.to_vec()));
        let (bk, bv) = b.gather(0, 1, 0);
        for (got, want) in bk.iter().chain(&bv).zip(k.iter().chain(&v)) {
            assert_eq!(*got, half::bf16::from_f32(*want).to_f32());
            assert!((got - want).abs() <= want.abs() / 256.0, "{got} vs {want}: within half a bf16 ulp");
        }
        assert_ne!(bk[1], k[1], "π is not a bf16 value");
    }

    #[test]
    fn sequences_share_a_bounded_cache_and_give_back_their_pages() {
        // 2 layers, rows of 2 values, pages of 3 positions, 4 pages.
        let mut c = KvCache::bounded(2, 2, KvDtype::F32, 3, 4).unwrap_or_else(|e| panic!("{e}"));
        let row = |p: usize, l: usize| [p as f32 * 10.0 + l as f32, -(p as f32)];
        let push = |c: &mut KvCache, from: usize, n: usize| {
            c.reserve(n).unwrap_or_else(|e| panic!("{e}"));
            for l in 0..2 {
                let k: Vec<f32> = (from..from + n).flat_map(|p| row(p, l)).collect();
                c.append(l, &k, &k);
            }
            c.commit(n);
        };
        push(&mut c, 0, 5); // sequence a: positions 0..5, pages [0, 1]
        let mut b = c.new_seq();
        c.swap_seq(&mut b);
        push(&mut c, 0, 4); // sequence b: pages [2, 3]
        assert_eq!(c.pages(), (3, 0, 4));
        let full = c.reserve(3).map_err(|e| e.to_string());
        assert!(full.is_err_and(|e| e.contains("the KV cache is full")), "a fifth page");
        c.truncate(2); // b gives back page 3
        assert_eq!(c.pages().1, 1);
        c.swap_seq(&mut b);
        push(&mut c, 5, 3); // a grows to 8 positions: page 3 again
        for l in 0..2 {
            let (k, _) = c.layer(l);
            for p in 0..8 {
                assert_eq!(k.row(p), row(p, l), "a's position {p} of layer {l}");
            }
        }
        c.release_seq(b);
        assert_eq!(c.pages(), (3, 1, 4), "b's last page back, a holds three");
        c.truncate(0);
        assert_eq!(c.pages().1, 4);
        if cfg!(debug_assertions) {
            assert!(c.layer(0).0.data.iter().all(|x| x.is_nan()), "freed pages are poisoned");
        }
    }
}
