//! Linear projection `y[n, out] = x[n, in] · W[out, in]ᵀ`.
//!
//! Two implementations sit side by side. [`linear_ref`] is the obvious triple loop with one
//! f32 accumulator per output, kept as the oracle. [`linear`] is the one the model runs: it
//! hands the same product to the `gemm` crate, which blocks for cache and spreads the work over
//! all cores with rayon. `W` stays in PyTorch's `[out, in]` layout, so the right-hand operand is
//! read as the transpose through strides and nothing is copied.

/// Reference: `y[r, o] = Σ_i x[r, i] · w[o, i]`, accumulated left to right in f32.
pub fn linear_ref(x: &[f32], w: &[f32], rows: usize, d_in: usize, d_out: usize) -> Vec<f32> {
    assert_eq!(x.len(), rows * d_in, "linear_ref: x has the wrong length");
    assert_eq!(w.len(), d_out * d_in, "linear_ref: w has the wrong length");
    let mut y = vec![0f32; rows * d_out];
    for r in 0..rows {
        let xr = &x[r * d_in..(r + 1) * d_in];
        for o in 0..d_out {
            let wo = &w[o * d_in..(o + 1) * d_in];
            y[r * d_out + o] = xr.iter().zip(wo).map(|(a, b)| a * b).sum();
        }
    }
    y
}

/// Fast path: the same product through `gemm`, multithreaded.
///
/// `y` must hold `rows * d_out` values; every element is overwritten.
pub fn linear_into(y: &mut [f32], x: &[f32], w: &[f32], rows: usize, d_in: usize, d_out: usize) {
    assert_eq!(x.len(), rows * d_in, "linear: x has the wrong length");
    assert_eq!(w.len(), d_out * d_in, "linear: w has the wrong length");
    assert_eq!(y.len(), rows * d_out, "linear: y has the wrong length");
    if rows == 0 || d_out == 0 {
        return;
    }
    // Small products are not worth waking the thread pool for.
    let parallelism =
        if rows * d_in * d_out >= 1 << 18 { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
    // SAFETY: the strides below describe exactly the slices checked above:
    // dst is [rows, d_out] row-major, lhs is [rows, d_in] row-major, and rhs is Wᵀ, i.e. the
    // element (k, j) lives at w[j * d_in + k]. `read_dst` is false, so `y` is only written.
    unsafe {
        gemm::gemm(
            rows,
            d_out,
            d_in,
            y.as_mut_ptr(),
            1,
            d_out as isize,
            false,
            x.as_ptr(),
            1,
            d_in as isize,
            w.as_ptr(),
            d_in as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Allocating convenience wrapper around [`linear_into`].
pub fn linear(x: &[f32], w: &[f32], rows: usize, d_in: usize, d_out: usize) -> Vec<f32> {
    let mut y = vec![0f32; rows * d_out];
    linear_into(&mut y, x, w, rows, d_in, d_out);
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use dspark_testkit::{rel_err, Rng};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The gemm path equals the triple loop on fresh random inputs (f32: 1e-5 relative),
        /// with the output poisoned beforehand so an unwritten element fails.
        #[test]
        fn gemm_matches_reference(seed in any::<u64>(), rows in 1usize..9, d_in in 1usize..300, d_out in 1usize..200) {
            let mut rng = Rng(seed);
            let x = rng.vec(rows * d_in);
            let w = rng.vec(d_out * d_in);
            let want = linear_ref(&x, &w, rows, d_in, d_out);
            let mut got = vec![f32::NAN; rows * d_out];
            linear_into(&mut got, &x, &w, rows, d_in, d_out);
            prop_assert!(got.iter().all(|v| v.is_finite()));
            prop_assert!(rel_err(&got, &want) <= 1e-5, "rel err {}", rel_err(&got, &want));
        }
    }

    #[test]
    fn gemm_matches_reference_at_a_parallel_size() {
        let (rows, d_in, d_out) = (7, 512, 384);
        let mut rng = Rng(7);
        let x = rng.vec(rows * d_in);
        let w = rng.vec(d_out * d_in);
        let mut got = vec![f32::NAN; rows * d_out];
        linear_into(&mut got, &x, &w, rows, d_in, d_out);
        assert!(rel_err(&got, &linear_ref(&x, &w, rows, d_in, d_out)) <= 1e-5);
    }
}
