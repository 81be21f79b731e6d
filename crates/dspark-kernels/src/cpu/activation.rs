//! SwiGLU, the Qwen3 MLP nonlinearity: `h = silu(gate) ⊙ up`, with `silu(x) = x · σ(x)`.
//!
//! The MLP is `down(silu(gate_proj(x)) ⊙ up_proj(x))`; this file holds only the elementwise
//! middle so the projections stay in `matmul`.

/// `silu(x) = x / (1 + e^(−x))`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Writes `silu(gate[i]) · up[i]` into `gate` (the gate buffer is dead afterwards).
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_known_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((silu(-1.0) + 0.268_941_4).abs() < 1e-6);
    }
}
