//! Checkpoint element types and their conversion to f32.
//!
//! Qwen3 checkpoints ship bf16; tiny test checkpoints are often f32, and some community
//! exports are f16. All three widen to f32 exactly (every bf16 and f16 value is an f32
//! value), so the CPU reference computes from any of them without rounding the weights.
//! Bytes are little-endian as safetensors specifies; the conversion reads them with
//! `from_le_bytes` so it does not depend on the source buffer's alignment.

use half::{bf16, f16};

/// An element type the engine can load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The name safetensors headers use ("F32", "F16", "BF16").
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
        }
    }

    /// Parses a safetensors dtype name; `None` for types the engine does not load.
    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        match name {
            "F32" => Some(DType::F32),
            "F16" => Some(DType::F16),
            "BF16" => Some(DType::BF16),
            _ => None,
        }
    }

    /// Widens `bytes` (a whole number of elements of this type) to f32.
    ///
    /// Panics if `bytes.len()` is not a multiple of [`DType::size`]; callers check tensor
    /// byte lengths against their shapes before converting.
    pub fn to_f32(self, bytes: &[u8]) -> Vec<f32> {
        assert!(bytes.len().is_multiple_of(self.size()), "{self:?} buffer of {} bytes", bytes.len());
        match self {
            DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            DType::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            DType::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn widening_round_trips(v in -1e4f32..1e4) {
            let b = bf16::from_f32(v);
            prop_assert_eq!(DType::BF16.to_f32(&b.to_le_bytes()), vec![b.to_f32()]);
            let h = f16::from_f32(v);
            prop_assert_eq!(DType::F16.to_f32(&h.to_le_bytes()), vec![h.to_f32()]);
            prop_assert_eq!(DType::F32.to_f32(&v.to_le_bytes()), vec![v]);
        }
    }

    #[test]
    fn names_round_trip() {
        for d in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(DType::from_safetensors_name(d.safetensors_name()), Some(d));
        }
        assert_eq!(DType::from_safetensors_name("I64"), None);
    }
}
