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

/// Reference attention; returns `[rows, n_heads · head_dim]`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], s: AttnShape, mask: Mask) -> Vec<f32> {
    let AttnShape { rows, kv_len, n_heads, n_kv_heads, head_dim: hd } = s;
    assert!(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: heads not a multiple of kv heads");
    assert_eq!(q.len(), rows * n_heads * hd, "attention: q shape");
    assert!(k.len() >= kv_len * n_kv_heads * hd, "attention: k shorter than kv_len");
    assert!(v.len() >= kv_len * n_kv_heads * hd, "attention: v shorter than kv_len");
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; rows * n_heads * hd];
    let mut scores = vec![0f32; kv_len];
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
                let kj = &k[(j * n_kv_heads + kvh) * hd..][..hd];
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
                let vj = &v[(j * n_kv_heads + kvh) * hd..][..hd];
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
}
