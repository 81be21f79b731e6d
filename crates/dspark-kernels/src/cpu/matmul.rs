//! Linear projection `y[n, out] = x[n, in] · W[out, in]ᵀ`.
//!
//! Three implementations sit side by side. [`linear_ref`] is the obvious triple loop with one
//! f32 accumulator per output, kept as the oracle. [`linear`] is the one the model runs:
//!
//! * up to [`SMALL_ROWS`] rows (decode, verify, a draft block, a batched round's rows): the
//!   batch-invariant kernel. Each output `y[r, o]` is the dot product of row r and weight row o
//!   in one fixed order (eight interleaved partial sums over k, then a fixed tree), so a row's
//!   bits do not depend on how many other rows share the call — the CPU twin of the GPU's
//!   small-M kernels. Without it a row's logits moved with the call's row count (the `gemm`
//!   crate takes a different path at one row, and blocks differently as rows grow; measured:
//!   1,417 of 1,536 outputs of a 512 → 1536 product differed between 1 and 2 rows), so
//!   speculative decoding, whose verify runs k + 1 rows where plain decoding runs one, could
//!   differ from it at a near-tie. Weight-stationary: each weight row is read once for all rows;
//!   outputs are spread over the cores with rayon.
//! * more rows (prompts): the `gemm` crate, which blocks for cache and spreads the work over all
//!   cores. Plain and speculative decoding share the prefill, so its rounding is the same in both.
//!
//! `W` stays in PyTorch's `[out, in]` layout (the gemm reads it as the transpose through
//! strides; nothing is copied).

use rayon::prelude::*;

/// Rows up to which [`linear_into`] takes the batch-invariant kernel (a CUDA step's rows).
pub const SMALL_ROWS: usize = 64;

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

/// `Σ_k a[k] · b[k]` in one fixed order: eight interleaved partial sums (lane k mod 8), the tail
/// into lanes 0.., then ((0+4)+(2+6)) + ((1+5)+(3+7)); `fma` fuses each multiply-add. The same
/// bits for the same inputs whatever calls it (on one machine: the dispatch below is fixed per
/// process).
#[inline(always)]
fn dot8_with<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] = if FMA { x[i].mul_add(y[i], acc[i]) } else { acc[i] + x[i] * y[i] };
        }
    }
    for (i, (x, y)) in at.iter().zip(bt).enumerate() {
        acc[i] = if FMA { x.mul_add(*y, acc[i]) } else { acc[i] + x * y };
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// The rows of one output chunk: `out[j · rows + r] = dot(x_r, w_{o0 + j})`.
#[inline(always)]
fn chunk_with<const FMA: bool>(out: &mut [f32], x: &[f32], w: &[f32], o0: usize, rows: usize, d_in: usize) {
    for (j, o_out) in out.chunks_mut(rows).enumerate() {
        let wo = &w[(o0 + j) * d_in..(o0 + j + 1) * d_in];
        for (r, v) in o_out.iter_mut().enumerate() {
            *v = dot8_with::<FMA>(&x[r * d_in..(r + 1) * d_in], wo);
        }
    }
}

/// [`chunk_with`] compiled for AVX2 + FMA (taken when the CPU has them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_avx2(out: &mut [f32], x: &[f32], w: &[f32], o0: usize, rows: usize, d_in: usize) {
    chunk_with::<true>(out, x, w, o0, rows, d_in)
}

/// Whether this process's small products use AVX2 + FMA (decided once).
fn use_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX2.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn chunk(out: &mut [f32], x: &[f32], w: &[f32], o0: usize, rows: usize, d_in: usize) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked once in `use_avx2`).
        return unsafe { chunk_avx2(out, x, w, o0, rows, d_in) };
    }
    chunk_with::<false>(out, x, w, o0, rows, d_in)
}

/// The batch-invariant kernel (see the module docs): `y[r, o] = dot8(x_r, w_o)`.
fn linear_small(y: &mut [f32], x: &[f32], w: &[f32], rows: usize, d_in: usize, d_out: usize) {
    // Outputs in chunks a task: each weight row read once for every row of x; with several
    // rows the chunk's results land transposed in `yt` ([d_out, rows]) and are put back after.
    let tasks = if rows * d_in * d_out >= 1 << 18 { 4 * rayon::current_num_threads() } else { 1 };
    let per = d_out.div_ceil(tasks).max(16);
    let work = |(c, out): (usize, &mut [f32])| chunk(out, x, w, c * per, rows, d_in);
    if rows == 1 {
        y.par_chunks_mut(per).enumerate().for_each(work);
        return;
    }
    let mut yt = vec![0f32; d_out * rows];
    yt.par_chunks_mut(per * rows).enumerate().for_each(work);
    for o in 0..d_out {
        for r in 0..rows {
            y[r * d_out + o] = yt[o * rows + r];
        }
    }
}

/// Fast path: the batch-invariant kernel up to [`SMALL_ROWS`] rows, else `gemm`, multithreaded.
///
/// `y` must hold `rows * d_out` values; every element is overwritten.
pub fn linear_into(y: &mut [f32], x: &[f32], w: &[f32], rows: usize, d_in: usize, d_out: usize) {
    assert_eq!(x.len(), rows * d_in, "linear: x has the wrong length");
    assert_eq!(w.len(), d_out * d_in, "linear: w has the wrong length");
    assert_eq!(y.len(), rows * d_out, "linear: y has the wrong length");
    if rows == 0 || d_out == 0 {
        return;
    }
    if rows <= SMALL_ROWS {
        return linear_small(y, x, w, rows, d_in, d_out);
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// A row's outputs are the same bits whatever rows share the call (up to SMALL_ROWS),
        /// and where it sits among them: the batch-invariant kernel's promise.
        #[test]
        fn small_calls_are_batch_invariant(seed in any::<u64>(), rows in 2usize..=SMALL_ROWS, d_in in 1usize..300, d_out in 1usize..100) {
            let mut rng = Rng(seed);
            let x = rng.vec(rows * d_in);
            let w = rng.vec(d_out * d_in);
            let all = linear(&x, &w, rows, d_in, d_out);
            let r = (seed as usize) % rows;
            let alone = linear(&x[r * d_in..(r + 1) * d_in], &w, 1, d_in, d_out);
            prop_assert_eq!(&all[r * d_out..(r + 1) * d_out], &alone[..], "row {} of {}", r, rows);
        }
    }

    #[test]
    fn both_paths_match_the_reference() {
        // 7 rows at a size the small path splits over threads; past SMALL_ROWS, the gemm crate.
        for (seed, (rows, d_in, d_out)) in [(7, (7, 512, 384)), (9, (SMALL_ROWS + 9, 96, 40))] {
            let mut rng = Rng(seed);
            let x = rng.vec(rows * d_in);
            let w = rng.vec(d_out * d_in);
            let mut got = vec![f32::NAN; rows * d_out];
            linear_into(&mut got, &x, &w, rows, d_in, d_out);
            let e = rel_err(&got, &linear_ref(&x, &w, rows, d_in, d_out));
            assert!(e <= 1e-5, "{rows} x {d_in} -> {d_out}: rel err {e}");
        }
    }
}
