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
//!
//! `e4m3` is for FP8 targets: their projections take x quantized to E4M3 per row and 128-wide
//! group (s = max|x| / 448), as Qwen, vLLM and transformers run `Qwen3-8B-FP8`
//! (`activation_scheme: dynamic`), and multiply on E4M3 MMAs (the sm_89 and sm_90 PTX: Ada,
//! Hopper or newer, kernels/fp8.cuh; on Hopper ptxas widens both operands to f16 for HMMAs, so
//! the gain is one MMA column a row at 8 rows, and one row alone is slower — docs/perf.md; Ada
//! has the MMA itself); bf16 matrices keep
//! f32-exact x. Not the CPU reference's W8A16 arithmetic, so GPU only; a row's bits still do
//! not depend on its launch.

/// The activations' precision in the bf16 tensor-core matvecs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activations {
    /// f32-exact: three bf16 parts a value.
    #[default]
    F32,
    /// Rounded to the nearest bf16: one part.
    Bf16,
    /// FP8 targets: E4M3 per row and 128-wide group (W8A8, as vLLM).
    E4m3,
}

impl Activations {
    /// Parses `f32` / `bf16` / `e4m3` (the CLI's `--activations`).
    pub fn parse(s: &str) -> Option<Activations> {
        match s {
            "f32" => Some(Activations::F32),
            "bf16" => Some(Activations::Bf16),
            "e4m3" => Some(Activations::E4m3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Bf16 => "bf16",
            Activations::E4m3 => "e4m3",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Activations;

    #[test]
    fn names_round_trip() {
        for a in [Activations::F32, Activations::Bf16, Activations::E4m3] {
            assert_eq!(Activations::parse(a.name()), Some(a));
        }
        assert_eq!(Activations::parse("fp8"), None);
        assert_eq!(Activations::default(), Activations::F32);
    }
}
