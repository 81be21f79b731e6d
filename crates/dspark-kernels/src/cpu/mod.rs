//! CPU reference ops, one file per op family, all in f32.
//!
//! Layout convention shared by every op: activations are row-major `[rows, dim]` slices;
//! linear weights are PyTorch's `[out, in]` row-major, so `y = x · Wᵀ`.

pub mod activation;
pub mod argmax;
pub mod attention;
pub mod matmul;
pub mod rmsnorm;
pub mod rope;

/// `x` rounded to the nearest bf16 (ties to even) and widened back: what a bf16 KV cache keeps
/// of a key or value (`cuda::kv`; the GPU kernels store with `__float2bfloat16_rn`, the same
/// rounding). NaN stays NaN.
pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::round_bf16;

    #[test]
    fn round_bf16_is_nearest_even_and_exact_on_bf16_values() {
        // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: ties go to the even one (1).
        assert_eq!(round_bf16(f32::from_bits(0x3F80_8000)), 1.0);
        // 1 + 3·2⁻⁸ is halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: ties go to 1 + 2⁻⁶.
        assert_eq!(round_bf16(f32::from_bits(0x3F81_8000)), f32::from_bits(0x3F82_0000));
        // Just above halfway rounds up.
        assert_eq!(round_bf16(f32::from_bits(0x3F80_8001)), f32::from_bits(0x3F81_0000));
        for x in [0.0f32, -0.0, 1.0, -2.5, 3.0e38, 1.0e-40] {
            let r = round_bf16(x);
            assert_eq!(round_bf16(r).to_bits(), r.to_bits(), "{x}: rounding is idempotent");
            assert_eq!(r.to_bits() & 0xFFFF, 0, "{x}: the low half is cleared");
        }
        assert!(round_bf16(f32::NAN).is_nan());
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    /// A small deterministic generator (SplitMix64) so tests draw fresh inputs per case
    /// from a proptest-chosen seed without another dependency.
    pub struct Rng(pub u64);
    impl Rng {
        pub fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        /// Uniform in [-1, 1).
        pub fn f32(&mut self) -> f32 {
            ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        pub fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.f32()).collect()
        }
    }

    /// Largest absolute difference divided by the largest reference magnitude.
    pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        let diff = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        diff / scale
    }
}
