//! Rotary position embedding, NeoX ("rotate half") form, as Qwen3 uses it.
//!
//! For a head vector `x` of even length `d` at absolute position `p`, with
//! `inv_freq[i] = θ^(−2i/d)` for `i < d/2`:
//!
//! ```text
//! y[i]       = x[i] · cos(p·inv_freq[i]) − x[i + d/2] · sin(p·inv_freq[i])
//! y[i + d/2] = x[i + d/2] · cos(p·inv_freq[i]) + x[i] · sin(p·inv_freq[i])
//! ```
//!
//! The frequencies and angles are computed in f32 in the same order as transformers'
//! `Qwen3RotaryEmbedding` (θ raised to `2i/d` in f32, then inverted; the angle is the f32
//! product of position and frequency), so the reference agrees with it to rounding.

/// `inv_freq[i] = 1 / θ^(2i/d)` for `i < d/2`.
pub fn inv_freq(theta: f32, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect()
}

/// Rotates every head of every row in place. `x` is `[rows, heads, head_dim]`; row `r` sits at
/// absolute position `positions[r]`.
pub fn rope_inplace(x: &mut [f32], positions: &[usize], heads: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    let hd = 2 * half;
    assert_eq!(x.len(), positions.len() * heads * hd, "rope: x is not [rows, heads, head_dim]");
    let mut cos = vec![0f32; half];
    let mut sin = vec![0f32; half];
    for (row, &pos) in x.chunks_exact_mut(heads * hd).zip(positions) {
        for i in 0..half {
            let angle = pos as f32 * inv_freq[i];
            cos[i] = angle.cos();
            sin[i] = angle.sin();
        }
        for head in row.chunks_exact_mut(hd) {
            let (lo, hi) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity() {
        let f = inv_freq(1e6, 8);
        let mut x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let before = x.clone();
        rope_inplace(&mut x, &[0], 2, &f);
        assert_eq!(x, before);
    }

    #[test]
    fn rotation_preserves_norm_and_relative_angle() {
        // Rotations keep each (i, i + d/2) pair's length, and q·k depends only on the
        // position difference.
        let f = inv_freq(10_000.0, 8);
        let q: Vec<f32> = vec![0.3, -1.2, 0.5, 2.0, 1.1, 0.4, -0.7, 0.9];
        let k: Vec<f32> = vec![-0.8, 0.2, 1.5, -0.3, 0.6, 1.9, 0.1, -1.0];
        let dot_at = |pq: usize, pk: usize| {
            let (mut a, mut b) = (q.clone(), k.clone());
            rope_inplace(&mut a, &[pq], 1, &f);
            rope_inplace(&mut b, &[pk], 1, &f);
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!((dot_at(5, 2) - dot_at(13, 10)).abs() < 1e-4);
        let mut r = q.clone();
        rope_inplace(&mut r, &[7], 1, &f);
        let n0: f32 = q.iter().map(|v| v * v).sum();
        let n1: f32 = r.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
    }
}
