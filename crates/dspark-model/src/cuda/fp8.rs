//! Block-scaled FP8 linears on the device: Qwen's FP8 checkpoints (`checkpoint::fp8`) in the
//! layout the FP8 matvec and the prefill's widening read (kernels/fp8.cuh).
//!
//! ```text
//! checkpoint, per linear:  weight F8_E4M3 [n, k],  weight_scale_inv [⌈n/bn⌉, ⌈k/bk⌉]
//! device, per projection:  q      u8   [rows, k]        the bytes, stacked (q|k|v) or
//!                                                       interleaved (gate|up) as bf16 weights are,
//!                                                       in tile order where rows % 16 = k % 64 = 0
//!                                                       (kernels/fp8.cuh; `Image::tiled`)
//!                          scale  f32  [Σ ⌈n_i/bn⌉, ⌈k/bk⌉]  every part's scales, one after another
//!                          srow   u32  [rows]           the scale row of each device row
//! W[o, c] = e4m3(q[o, c]) · scale[srow[o], c / bk]
//! ```
//!
//! The bytes are the checkpoint's, moved (into tiles) and never changed, so the device computes with exactly
//! the weights the CPU reference dequantizes; scales are widened to f32 (exact from bf16, f16 or
//! f32). `srow` lets one kernel serve both row orders without knowing which parts a projection
//! fuses. A projection whose parts are not all FP8 (`modules_to_not_convert` naming one of
//! them) is dequantized to f32 on the host instead: exact, slower, and never seen in Qwen's
//! releases.

use crate::checkpoint::fp8::{dequantize, Fp8Quant};
use crate::checkpoint::safetensors::Checkpoint;
use crate::cuda::layers::drv;
use crate::cuda::upload::Image;
use crate::cuda::weights::WeightSource;
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;
use dspark_kernels::cuda::ops::{Fp8Buf, WeightBuf};
use dspark_tensor::arena::Arena;
use dspark_tensor::DType;

/// How the parts of a fused projection lie on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    /// Rows of the first part, then the second's, … (q|k|v; one part: a plain matrix).
    Stacked,
    /// Two parts of one shape, rows alternating: a_0, b_0, a_1, b_1, … (gate|up).
    Interleaved,
}

/// `srow` for parts of `rows[i]` rows each, whose scale tables of `⌈rows[i]/bn⌉` rows are
/// stacked in part order, laid out in `order`.
pub fn scale_rows(rows: &[usize], bn: usize, order: RowOrder) -> Vec<u32> {
    let mut first = Vec::with_capacity(rows.len());
    let mut off = 0usize;
    for &n in rows {
        first.push(off);
        off += n.div_ceil(bn);
    }
    match order {
        RowOrder::Stacked => {
            rows.iter().zip(&first).flat_map(|(&n, &f)| (0..n).map(move |r| (f + r / bn) as u32)).collect()
        }
        RowOrder::Interleaved => {
            let n = rows.first().copied().unwrap_or(0);
            (0..n).flat_map(|r| first.iter().map(move |&f| (f + r / bn) as u32)).collect()
        }
    }
}

/// Checks the modules of one projection for [`RowOrder::Interleaved`] (two of one shape) and
/// that all parts share their width.
fn check_parts(modules: &[(&str, [usize; 2])], order: RowOrder) -> Result<usize> {
    let bad = |m: String| Err(Error::Request(format!("fp8 projection {:?}: {m}", modules.first().map(|p| p.0))));
    let Some(&(_, [_, k])) = modules.first() else {
        return bad("no parts".into());
    };
    if modules.iter().any(|(_, s)| s[1] != k) {
        return bad("parts of different widths".into());
    }
    if order == RowOrder::Interleaved && (modules.len() != 2 || modules[0].1 != modules[1].1) {
        return bad("interleaving needs two parts of one shape".into());
    }
    Ok(k)
}

/// Loads one projection of an FP8 checkpoint `ck` (`modules`: names without `.weight`, shapes
/// `[rows, cols]`) in `order`. FP8 parts are checked (`Fp8Quant::check_linear`: dtype, shape,
/// finite positive scales, each named on error) and their bytes written by `put` into the
/// projection's byte buffer; plain parts go through `plain` (the same source's plain path).
pub fn load_linears(
    ck: &Checkpoint,
    plain: &dyn WeightSource,
    arena: &Arena,
    quant: &Fp8Quant,
    modules: &[(&str, [usize; 2])],
    order: RowOrder,
    put: &dyn Fn(&Image<'_>, &mut CudaSlice<u8>) -> Result<()>,
) -> Result<WeightBuf> {
    let k = check_parts(modules, order)?;
    let parts = modules.iter().map(|(m, [n, k])| quant.check_linear(ck, m, (*n, *k))).collect::<Result<Vec<_>>>()?;
    let weight = |m: &str| format!("{m}.weight");
    if parts.iter().all(Option::is_none) {
        return plain_linears(plain, arena, modules, order);
    }
    if parts.iter().any(Option::is_none) {
        // Mixed: every part as f32 (FP8 ones dequantized exactly as the CPU reference does).
        let mats = modules
            .iter()
            .zip(&parts)
            .map(|((m, [n, k]), p)| match p {
                Some((bytes, scales)) => Ok(dequantize(bytes, scales, (*n, *k), quant.block)),
                None => ck.f32(&weight(m), &[*n, *k]),
            })
            .collect::<Result<Vec<_>>>()?;
        let v: Vec<f32> = match order {
            RowOrder::Stacked => mats.concat(),
            RowOrder::Interleaved => (0..modules[0].1[0])
                .flat_map(|r| mats.iter().flat_map(move |m| m[r * k..(r + 1) * k].iter().copied()))
                .collect(),
        };
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        return arena.weight(DType::F32, &bytes).map_err(drv);
    }
    let parts: Vec<(&[u8], Vec<f32>)> = parts.into_iter().flatten().collect();
    let image = match order {
        RowOrder::Stacked => Image::concat(parts.iter().map(|(b, _)| *b).collect()),
        RowOrder::Interleaved => Image::interleave(parts[0].0, parts[1].0, modules[0].1[0])
            .ok_or_else(|| Error::Request(format!("fp8 {}: cannot interleave with {}", modules[0].0, modules[1].0)))?,
    };
    // In tile order where the fused shape allows (`fp8_tiled`), as the kernels read it.
    let image = match Image::tiled(image.clone(), k) {
        Some(tiled) => tiled,
        None => image,
    };
    let mut q = arena.zeros::<u8>(image.len()).map_err(drv)?;
    put(&image, &mut q)?;
    let rows: Vec<usize> = modules.iter().map(|(_, s)| s[0]).collect();
    let scales: Vec<f32> = parts.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    device_buf(arena, q, &scales, &scale_rows(&rows, quant.block[0], order), k, quant.block[1])
}

/// One projection of plain (unquantized) linears from `src` in `order`: a matrix, q|k|v-style
/// stacked parts or gate|up-style interleaved pairs (`WeightSource::matrix` / `stacked` /
/// `interleaved` of `<module>.weight`).
pub fn plain_linears(
    src: &dyn WeightSource,
    arena: &Arena,
    modules: &[(&str, [usize; 2])],
    order: RowOrder,
) -> Result<WeightBuf> {
    let weight = |m: &str| format!("{m}.weight");
    match (order, modules) {
        (RowOrder::Stacked, [(m, s)]) => src.matrix(arena, &weight(m), s),
        (RowOrder::Stacked, _) => {
            let names: Vec<String> = modules.iter().map(|(m, _)| weight(m)).collect();
            let list: Vec<(&str, &[usize])> =
                names.iter().zip(modules).map(|(n, (_, s))| (n.as_str(), s.as_slice())).collect();
            src.stacked(arena, &list)
        }
        (RowOrder::Interleaved, [a, b]) => src.interleaved(arena, &weight(a.0), &weight(b.0), &a.1),
        (RowOrder::Interleaved, _) => {
            Err(Error::Request(format!("{:?}: interleaving needs two parts", modules.first().map(|m| m.0))))
        }
    }
}

/// An [`Fp8Buf`] from its bytes (on the device) and its host scale table and row map, checked.
pub fn device_buf(
    arena: &Arena,
    q: CudaSlice<u8>,
    scales: &[f32],
    srow: &[u32],
    cols: usize,
    block_k: usize,
) -> Result<WeightBuf> {
    let srow_max = srow.iter().copied().max().unwrap_or(0);
    let buf = Fp8Buf::new(
        q,
        arena.upload(scales).map_err(drv)?,
        (arena.upload(srow).map_err(drv)?, srow_max),
        cols,
        block_k,
        arena.shared_zeros::<u32>("fp8 x split", Fp8Buf::xsplit_len(cols)).map_err(drv)?,
    )
    .map_err(|e| Error::Request(e.to_string()))?;
    Ok(WeightBuf::Fp8(buf))
}

/// `put` for the plain path: the image assembled on the host, one synchronous copy.
pub fn put_plain(arena: &Arena, image: &Image<'_>, dst: &mut CudaSlice<u8>) -> Result<()> {
    let mut host = vec![0u8; image.len()];
    image.fill(0, &mut host);
    arena.stream().memcpy_htod(&host, dst).map_err(drv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_rows_follow_the_row_order() {
        // q|k|v of 5, 2, 2 rows in blocks of 2: scale tables of 3, 1, 1 rows.
        assert_eq!(scale_rows(&[5, 2, 2], 2, RowOrder::Stacked), vec![0, 0, 1, 1, 2, 3, 3, 4, 4]);
        // gate|up of 3 rows in blocks of 2: tables of 2 rows each, rows alternating.
        assert_eq!(scale_rows(&[3, 3], 2, RowOrder::Interleaved), vec![0, 2, 0, 2, 1, 3]);
        assert_eq!(scale_rows(&[4], 128, RowOrder::Stacked), vec![0; 4]);
    }
}
