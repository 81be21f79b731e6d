//! Scaled dot-product attention with grouped-query heads, over a key/value cache.
//!
//! Shapes: `q` is `[rows, n_heads, head_dim]`; `k` and `v` are `[kv_len, n_kv_heads, head_dim]`
//! (the cache, already holding the new rows). Query head `h` reads kv head
//! `h / (n_heads / n_kv_heads)`. Output is `[rows, n_heads · head_dim]`.
//!
//! `o = softmax(q·kᵀ / sqrt(head_dim)) · v`, with the softmax taken over the keys a query may
//! see. Two visibility rules cover every use in the engine:
//! * [`Mask::Causal`] — the target model. Query row `r` sits at absolute position
//!   `first_pos + r` and sees keys `0 ..= first_pos + r`. Decode (1 row), verify (k rows) and
//!   prefill (N rows) are the same call with different row counts.
//! * [`Mask::None`] — the DSpark draft block, which attends bidirectionally to all of context
//!   and block.
//!
//! The softmax subtracts the running maximum first, in f32, as every reference does.
//!
//! Where the cache's rows live is the caller's: [`attention`] takes them contiguous,
//! [`attention_rows`] through [`KvRows`] — [`Paged`] for a paged cache (position j in page
//! `pages[j / page]`, `dspark-model`'s `kv_pages`). Both run the same arithmetic in the same
//! order, so a paged cache's output equals the contiguous one's bit for bit (tested below).

/// Which keys each query row may attend to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Row `r` is at position `first_pos + r` and sees keys `0..=first_pos + r`.
    Causal { first_pos: usize },
    /// Every row sees every key.
    None,
}

/// Shape of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub rows: usize,
    pub kv_len: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// The cached rows of one layer's keys (or values): row `j` is position j's
/// `[n_kv_heads · head_dim]`.
pub trait KvRows {
    fn row(&self, j: usize) -> &[f32];
    /// Positions it holds.
    fn positions(&self) -> usize;
}

/// Rows stored one after another.
#[derive(Clone, Copy, Debug)]
pub struct Contiguous<'a> {
    pub data: &'a [f32],
    pub row: usize,
}

impl KvRows for Contiguous<'_> {
    #[inline]
    fn row(&self, j: usize) -> &[f32] {
        &self.data[j * self.row..][..self.row]
    }

    fn positions(&self) -> usize {
        self.data.len() / self.row.max(1)
    }
}

/// Rows stored in pages of `page` positions: position j is row `j % page` of page
/// `pages[j / page]` of `data` (`[pages, page, row]`).
#[derive(Clone, Copy, Debug)]
pub struct Paged<'a> {
    pub data: &'a [f32],
    pub pages: &'a [u32],
    pub page: usize,
    pub row: usize,
}

impl Paged<'_> {
    /// Where position `j` of a sequence with page table `pages` lives in the storage, in rows:
    /// row `j % page` of page `pages[j / page]` (the one address rule of a paged cache, for
    /// its writer as for this reader).
    #[inline]
    pub fn slot(pages: &[u32], page: usize, j: usize) -> usize {
        pages[j / page] as usize * page + j % page
    }
}

impl KvRows for Paged<'_> {
    #[inline]
    fn row(&self, j: usize) -> &[f32] {
        &self.data[Paged::slot(self.pages, self.page, j) * self.row..][..self.row]
    }

    fn positions(&self) -> usize {
        self.pages.len() * self.page
    }
}

/// Reference attention over contiguous rows; returns `[rows, n_heads · head_dim]`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], s: AttnShape, mask: Mask) -> Vec<f32> {
    let row = s.n_kv_heads * s.head_dim;
    assert!(k.len() >= s.kv_len * row, "attention: k shorter than kv_len");
    assert!(v.len() >= s.kv_len * row, "attention: v shorter than kv_len");
    attention_rows(q, &Contiguous { data: k, row }, &Contiguous { data: v, row }, s, mask)
}

/// [`attention`] over rows wherever they are stored.
pub fn attention_rows(q: &[f32], k: &impl KvRows, v: &impl KvRows, s: AttnShape, mask: Mask) -> Vec<f32> {
    let AttnShape { rows, kv_len, n_heads, n_kv_heads, head_dim: hd } = s;
    assert!(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: heads not a multiple of kv heads");
    assert_eq!(q.len(), rows * n_heads * hd, "attention: q shape");
    assert!(k.positions() >= kv_len && v.positions() >= kv_len, "attention: the cache holds fewer than kv_len");
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; rows * n_heads * hd];
    let mut scores = vec![0f32; kv_len];
    // Each position's rows looked up once per call, not once per query row and head (a paged
    // lookup divides by the page size).
    let (krows, vrows): (Vec<&[f32]>, Vec<&[f32]>) = (0..kv_len).map(|j| (k.row(j), v.row(j))).unzip();
    for r in 0..rows {
        let visible = match mask {
            Mask::Causal { first_pos } => (first_pos + r + 1).min(kv_len),
            Mask::None => kv_len,
        };
        for h in 0..n_heads {
            let kvh = h / group;
            let qh = &q[(r * n_heads + h) * hd..][..hd];
            let mut max = f32::NEG_INFINITY;
            for (j, sc) in scores[..visible].iter_mut().enumerate() {
                let kj = &krows[j][kvh * hd..][..hd];
                *sc = qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                max = max.max(*sc);
            }
            let mut denom = 0f32;
            for sc in scores[..visible].iter_mut() {
                *sc = (*sc - max).exp();
                denom += *sc;
            }
            let oh = &mut out[(r * n_heads + h) * hd..][..hd];
            for (j, &p) in scores[..visible].iter().enumerate() {
                let vj = &vrows[j][kvh * hd..][..hd];
                let w = p / denom;
                for (o, x) in oh.iter_mut().zip(vj) {
                    *o += w * x;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_key_returns_its_value() {
        let s = AttnShape { rows: 1, kv_len: 1, n_heads: 2, n_kv_heads: 1, head_dim: 2 };
        let o = attention(&[1.0, 2.0, 3.0, 4.0], &[0.5, 0.5], &[7.0, -1.0], s, Mask::None);
        assert_eq!(o, vec![7.0, -1.0, 7.0, -1.0]);
    }

    #[test]
    fn causal_rows_ignore_later_keys() {
        // Two rows at positions 0 and 1: row 0 must not see key 1 however large its score.
        let s = AttnShape { rows: 2, kv_len: 2, n_heads: 1, n_kv_heads: 1, head_dim: 1 };
        let q = [1.0, 1.0];
        let k = [0.0, 100.0];
        let v = [3.0, 5.0];
        let o = attention(&q, &k, &v, s, Mask::Causal { first_pos: 0 });
        assert_eq!(o[0], 3.0);
        assert!((o[1] - 5.0).abs() < 1e-6);
        let o = attention(&q, &k, &v, s, Mask::None);
        assert!((o[0] - 5.0).abs() < 1e-6);
    }

    #[test]
    fn paged_rows_give_the_contiguous_bits() {
        // Fresh random inputs; pages in a scrambled order, some unused, the last one partly.
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        };
        for (page, kv_len, first_pos, mask_causal) in
            [(1usize, 5usize, 0usize, true), (3, 11, 7, true), (4, 16, 13, false), (16, 37, 30, true)]
        {
            let (nh, nkv, hd) = (4, 2, 8);
            let row = nkv * hd;
            let rows = kv_len - first_pos;
            let q: Vec<f32> = (0..rows * nh * hd).map(|_| rand()).collect();
            let k: Vec<f32> = (0..kv_len * row).map(|_| rand()).collect();
            let v: Vec<f32> = (0..kv_len * row).map(|_| rand()).collect();
            let n_pages = kv_len.div_ceil(page);
            // The sequence's pages stored in reverse order after two unused ones.
            let slots = n_pages + 2;
            let pages: Vec<u32> = (0..n_pages).map(|i| (slots - 1 - i) as u32).collect();
            let mut kp = vec![f32::NAN; slots * page * row];
            let mut vp = kp.clone();
            for j in 0..kv_len {
                let at = (pages[j / page] as usize * page + j % page) * row;
                kp[at..at + row].copy_from_slice(&k[j * row..][..row]);
                vp[at..at + row].copy_from_slice(&v[j * row..][..row]);
            }
            let s = AttnShape { rows, kv_len, n_heads: nh, n_kv_heads: nkv, head_dim: hd };
            let mask = if mask_causal { Mask::Causal { first_pos } } else { Mask::None };
            let want = attention(&q, &k, &v, s, mask);
            let (pk, pv) =
                (Paged { data: &kp, pages: &pages, page, row }, Paged { data: &vp, pages: &pages, page, row });
            let got = attention_rows(&q, &pk, &pv, s, mask);
            assert!(want.iter().all(|x| x.is_finite()), "page {page}");
            let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "page {page}, {kv_len} keys: paged attention differs from contiguous");
        }
    }
}
