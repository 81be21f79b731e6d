//! Block-scaled FP8 (E4M3) weights: the reference of the FP8 matvec and of the prefill's
//! widening (kernels/fp8.cu, kernels/matvec.cu `matvec_tc_*_fp8`).
//!
//! ```text
//! W[o, c] = e4m3(q[o, c]) · scale[srow[o], c / bk]        (one f32 rounding: the multiply)
//! ```
//!
//! `q` is row-major `[rows, cols]` E4M3 ("fn") bytes — 1 sign, 4 exponent (bias 7), 3 mantissa
//! bits, no infinities, NaN only at `S.1111.111`, largest 448 — and `srow[o]` names the row of
//! the scale table `[scale rows, ⌈cols / bk⌉]` that row `o` uses (`o / bn` for one checkpoint
//! matrix; stacked or interleaved for fused projections, crates/dspark-model/src/cuda/fp8.rs).
//! Every E4M3 value is exactly an f32 and a bf16, so the only rounding is the scale's multiply;
//! the matvec is then the f32 `matmul::linear` over the dequantized matrix (W8A16: activations
//! stay f32). The GPU's tensor-core kernel sums each 64-wide chunk of unscaled products and
//! scales the chunk's sum instead, a different order of the same exact products: it agrees
//! with this reference to f32 rounding (1e-5 relative), not bit for bit.

/// The f32 value of an E4M3 ("fn") byte; NaN for `S.1111.111`.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f32;
    if e == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 { m / 8.0 * 2f32.powi(-6) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) };
    sign * mag
}

/// `W[o, c] = e4m3(q[o, c]) · scale[srow[o] · scale_cols + c / bk]` for `srow.len()` rows of
/// `cols` columns, `scale_cols = ⌈cols / bk⌉`.
pub fn dequantize_rows(q: &[u8], scale: &[f32], srow: &[u32], cols: usize, bk: usize) -> Vec<f32> {
    let sc = cols.div_ceil(bk);
    (0..srow.len() * cols)
        .map(|x| {
            let (o, c) = (x / cols, x % cols);
            e4m3_to_f32(q[x]) * scale[srow[o] as usize * sc + c / bk]
        })
        .collect()
}

/// [`dequantize_rows`] for one checkpoint matrix `[n, k]` with `[bn, bk]` blocks (scale row
/// `o / bn`).
pub fn dequantize(q: &[u8], scale: &[f32], (n, k): (usize, usize), [bn, bk]: [usize; 2]) -> Vec<f32> {
    let srow: Vec<u32> = (0..n).map(|o| (o / bn) as u32).collect();
    dequantize_rows(q, scale, &srow, k, bk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_rows_pick_their_blocks() {
        // Two rows, four columns in blocks of 2; row 1 reads scale row 2.
        let q = [0x38u8; 8]; // 1.0 everywhere
        let scale = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(dequantize_rows(&q, &scale, &[0, 2], 4, 2), vec![1.0, 1.0, 2.0, 2.0, 5.0, 5.0, 6.0, 6.0]);
        assert_eq!(dequantize(&q, &scale[..4], (2, 4), [1, 2]), vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]);
    }
}
