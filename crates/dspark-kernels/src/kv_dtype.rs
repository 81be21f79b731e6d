//! The element type of a KV cache: f32 (the CPU reference's, bit for bit) or bf16 (half the
//! bytes per position; what transformers keeps for a bf16 model and what vLLM and llama.cpp
//! default to). Keys are rounded after k_norm and RoPE, values as projected, each once, to the
//! nearest bf16 ([`crate::cpu::round_bf16`]); attention widens them back exactly. The CPU
//! reference's cache (`dspark-model` `KvCache`) and the GPU's (`cuda::kv`) both follow it.

/// The element type of a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvDtype {
    #[default]
    F32,
    Bf16,
}

impl KvDtype {
    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
        }
    }

    /// `x` as a cache of this type keeps it, widened back to f32: as it is, or rounded once to
    /// the nearest bf16 ([`crate::cpu::round_bf16`], the GPU kernels' `store_kv`).
    pub fn keep(self, x: f32) -> f32 {
        match self {
            KvDtype::F32 => x,
            KvDtype::Bf16 => crate::cpu::round_bf16(x),
        }
    }

    /// What a kernel's name gains for this cache type (`attention_f32` → `attention_f32_kvbf16`).
    pub fn kernel_suffix(self) -> &'static str {
        match self {
            KvDtype::F32 => "",
            KvDtype::Bf16 => "_kvbf16",
        }
    }

    /// Parses `f32` / `bf16` (the CLI's `--kv-cache`).
    pub fn parse(s: &str) -> Option<KvDtype> {
        match s {
            "f32" => Some(KvDtype::F32),
            "bf16" => Some(KvDtype::Bf16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KvDtype;

    #[test]
    fn dtype_names_round_trip_and_name_kernels() {
        for d in [KvDtype::F32, KvDtype::Bf16] {
            assert_eq!(KvDtype::parse(d.name()), Some(d));
        }
        assert_eq!(KvDtype::parse("f16"), None);
        assert_eq!(KvDtype::F32.bytes(), 4);
        assert_eq!(KvDtype::Bf16.bytes(), 2);
        let pi = std::f32::consts::PI;
        assert_eq!(KvDtype::F32.keep(pi), pi);
        assert_eq!(KvDtype::Bf16.keep(pi), crate::cpu::round_bf16(pi));
        assert_ne!(KvDtype::Bf16.keep(pi), pi);
        assert_eq!(format!("attention_f32{}", KvDtype::Bf16.kernel_suffix()), "attention_f32_kvbf16");
        assert_eq!(format!("attention_f32{}", KvDtype::F32.kernel_suffix()), "attention_f32");
    }
}
