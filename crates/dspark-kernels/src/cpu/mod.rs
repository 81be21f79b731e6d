//! CPU reference ops, one file per op family, all in f32.
//!
//! Layout convention shared by every op: activations are row-major `[rows, dim]` slices;
//! linear weights are PyTorch's `[out, in]` row-major, so `y = x · Wᵀ`.

pub mod activation;
pub mod argmax;
pub mod attention;
pub mod fp8;
pub mod matmul;
pub mod rmsnorm;
pub mod rope;
pub mod sample;

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
