//! RMSNorm: `y = x / sqrt(mean(x²) + eps) · w`, applied independently to each row of `dim`
//! values.
//!
//! Qwen3 uses it in three places: before attention and before the MLP (rows of `hidden`), and
//! per attention head on q and k (rows of `head_dim`, the `q_norm` / `k_norm` weights). The
//! statistics are taken in f32 as transformers does; everything here is f32 anyway.

/// Normalises every `dim`-long row of `x` in place.
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let dim = w.len();
    assert!(dim > 0 && x.len().is_multiple_of(dim), "rmsnorm: x is not whole rows of w.len()");
    for row in x.chunks_exact_mut(dim) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// Out-of-place form: returns the normalised copy of `x`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    rmsnorm_inplace(&mut y, w, eps);
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_weight_gives_unit_rms() {
        let x: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
        let y = rmsnorm(&x, &[1.0; 8], 0.0);
        for row in y.chunks(8) {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / 8.0;
            assert!((ms - 1.0).abs() < 1e-5, "mean square {ms}");
        }
    }

    #[test]
    fn weight_scales_each_channel() {
        let y = rmsnorm(&[2.0, 2.0], &[1.0, 3.0], 0.0);
        assert_eq!(y, vec![1.0, 3.0]);
    }
}
