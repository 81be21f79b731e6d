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
