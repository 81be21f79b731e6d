//! How the bf16 tensor-core matvecs take their f32 activations (`--activations`).
//!
//! By default (`f32`) a projection's x stays f32-exact: kernels/matvec.cu splits it into three
//! bf16 parts and runs three MMAs a chunk, so the products equal the f32 CPU reference's up to
//! summation order. That costs nothing at one to eight rows, where the weights' bytes bound a
//! launch, but beyond eight rows (many requests in one batched round, issue #30) the three parts
//! and their split bound it instead. `bf16` rounds x to the nearest bf16 and runs one MMA a
//! chunk (the `_x1` kernels), as bf16 engines do: a third of the tensor work, activations with
//! bf16's 8 significant bits. Either way a row's bits do not depend on the rows launched with
//! it, so speculative decoding stays lossless against plain decoding in the same mode. FP8
//! matrices keep their own split (fp8.cu) in both modes.

/// The activations' precision in the bf16 tensor-core matvecs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activations {
    /// f32-exact: three bf16 parts a value.
    #[default]
    F32,
    /// Rounded to the nearest bf16: one part.
    Bf16,
}

impl Activations {
    /// Parses `f32` / `bf16` (the CLI's `--activations`).
    pub fn parse(s: &str) -> Option<Activations> {
        match s {
            "f32" => Some(Activations::F32),
            "bf16" => Some(Activations::Bf16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Bf16 => "bf16",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Activations;

    #[test]
    fn names_round_trip() {
        for a in [Activations::F32, Activations::Bf16] {
            assert_eq!(Activations::parse(a.name()), Some(a));
        }
        assert_eq!(Activations::parse("fp8"), None);
        assert_eq!(Activations::default(), Activations::F32);
    }
}
