//! GPU tier: every kernel against its CPU reference on fresh random inputs, at small shapes and
//! at Qwen3-8B's (hidden 4096, kv 1024, intermediate 12288, vocab 151936). Outputs are
//! poisoned with NaN before each launch so an unwritten element fails. Tolerance: 1e-5
//! relative (max |Δ| / max |reference|) for f32 math; bf16/f16 weights are widened exactly, so
//! the same bound applies against a reference fed the widened weights.
//!
//! Compiled only with `--features gpu-tests` (`cargo xtask test --gpu`): without a GPU these
//! tests would have nothing to run, and they are never counted as passing when skipped.
#![cfg(feature = "gpu-tests")]

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use dspark_kernels::cpu;
use dspark_kernels::cuda::ops::{OpScratch, StepLens, WeightBuf};
use dspark_kernels::cuda::Gpu;
use dspark_testkit::{rel_err, Rng};
use half::{bf16, f16};

/// Under compute-sanitizer (which slows kernels 10-100×) the tier sets `DSPARK_GPU_SMALL` and
/// the Qwen3-8B-sized cases are left out of that run; the plain run always includes them.
fn full_size() -> bool {
    std::env::var_os("DSPARK_GPU_SMALL").is_none()
}

fn gpu() -> Gpu {
    Gpu::new(0).expect("the GPU tier needs a CUDA device")
}

fn up(g: &Gpu, v: &[f32]) -> CudaSlice<f32> {
    g.stream.clone_htod(v).unwrap()
}

fn poisoned(g: &Gpu, n: usize) -> CudaSlice<f32> {
    g.stream.clone_htod(&vec![f32::NAN; n]).unwrap()
}

fn down(g: &Gpu, s: &CudaSlice<f32>) -> Vec<f32> {
    g.stream.clone_dtoh(s).unwrap()
}

/// A cache view's values, widened to f32.
fn kv_down(g: &Gpu, v: &dspark_kernels::cuda::kv::KvView<'_>) -> Vec<f32> {
    use dspark_kernels::cuda::kv::KvView;
    match v {
        KvView::F32(s) => g.stream.clone_dtoh(s).unwrap(),
        KvView::Bf16(s) => g.stream.clone_dtoh(s).unwrap().into_iter().map(|b| bf16::from_bits(b).to_f32()).collect(),
    }
}

/// The names of the kernels `f` launches on `g`, in order (the per-launch profiler on around it).
fn kernels_run(g: &Gpu, f: impl FnOnce(&Gpu)) -> Vec<String> {
    g.set_profiling(true).unwrap();
    f(g);
    let ran = g.take_profile().unwrap().into_iter().map(|k| k.name).collect();
    g.set_profiling(false).unwrap();
    ran
}

/// A weight in `dtype` plus the exact f32 values the device will see.
fn weight(g: &Gpu, v: &[f32], dtype: &str) -> (WeightBuf, Vec<f32>) {
    match dtype {
        "bf16" => {
            let h: Vec<u16> = v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect();
            let w: Vec<f32> = h.iter().map(|b| bf16::from_bits(*b).to_f32()).collect();
            (WeightBuf::Bf16(g.stream.clone_htod(&h).unwrap()), w)
        }
        "f16" => {
            let h: Vec<u16> = v.iter().map(|x| f16::from_f32(*x).to_bits()).collect();
            let w: Vec<f32> = h.iter().map(|b| f16::from_bits(*b).to_f32()).collect();
            (WeightBuf::F16(g.stream.clone_htod(&h).unwrap()), w)
        }
        _ => (WeightBuf::F32(up(g, v)), v.to_vec()),
    }
}

/// A block-scaled FP8 weight `[v.len() / cols, cols]` in `[bn, bk]` blocks made from `v` (its
/// bits pick each E4M3 byte: sign, exponents 0..7 so |value| < 2 and no NaN code, any
/// mantissa), scales in [0.5, 1), and rows reading their scale rows through an `srow` that is not
/// `o / bn` (so the lookup is exercised as fused projections use it), with the exact f32 values
/// it holds (`cpu::fp8::dequantize_rows`).
fn fp8_weight(g: &Gpu, v: &[f32], cols: usize, [bn, bk]: [usize; 2]) -> (WeightBuf, Vec<f32>) {
    use dspark_kernels::cuda::ops::Fp8Buf;
    let rows = v.len() / cols;
    let q: Vec<u8> = v.iter().map(|x| ((x.to_bits() >> 13) as u8 & 0x3f) | if *x < 0.0 { 0x80 } else { 0 }).collect();
    let (sr, sc) = (rows.div_ceil(bn), cols.div_ceil(bk));
    let mut rng = Rng(rows as u64 * 31 + cols as u64);
    let scale: Vec<f32> = (0..sr * sc).map(|_| 0.5 + 0.5 * rng.f32().abs().fract()).collect();
    let srow: Vec<u32> = (0..rows).map(|o| (((o / bn) * 5 + 3) % sr) as u32).collect();
    let want = cpu::fp8::dequantize_rows(&q, &scale, &srow, cols, bk);
    let srow_max = srow.iter().copied().max().unwrap_or(0);
    let buf = Fp8Buf::new(
        // The device order: tiles where the shape allows (what the loader uploads).
        g.stream.clone_htod(&dspark_kernels::cuda::ops::fp8_tile_order(&q, rows, cols)).unwrap(),
        up(g, &scale),
        (g.stream.clone_htod(&srow).unwrap(), srow_max),
        cols,
        bk,
        std::sync::Arc::new(g.stream.alloc_zeros::<u32>(Fp8Buf::xsplit_len(cols)).unwrap()),
    )
    .unwrap();
    (WeightBuf::Fp8(buf), want)
}

/// [`weight`] for a matrix of `cols` columns, with the FP8 layouts too: `fp8` in Qwen's
/// 128 × 128 blocks, `fp8b` in 16 × 64 blocks (the smallest the tensor-core kernel takes), `fp8s`
/// in 4 × 4 blocks (the general kernel's only).
fn weight_cols(g: &Gpu, v: &[f32], cols: usize, dtype: &str) -> (WeightBuf, Vec<f32>) {
    match dtype {
        "fp8" => fp8_weight(g, v, cols, [128, 128]),
        "fp8b" => fp8_weight(g, v, cols, [16, 64]),
        "fp8s" => fp8_weight(g, v, cols, [4, 4]),
        _ => weight(g, v, dtype),
    }
}

/// Whether `matvec` takes a tensor-core kernel for `dtype` at `d_in` (the wrapper's rule).
fn takes_tc(dtype: &str, d_in: usize) -> bool {
    match dtype {
        "bf16" => d_in.is_multiple_of(8),
        "fp8" | "fp8b" => d_in.is_multiple_of(16),
        _ => false,
    }
}

/// Scratch for `heads` query heads over any number of KV heads that divides them (the largest
/// partials of those), poisoned.
fn scratch(g: &Gpu, heads: usize, head_dim: usize) -> OpScratch {
    let sizes =
        (1..=heads).filter(|&k| heads.is_multiple_of(k)).map(|nkv| OpScratch::sizes((heads, nkv, head_dim), g.sms));
    let (ao, aml, am, at) = sizes.max().expect("one head at least");
    OpScratch {
        attn_o: poisoned(g, ao),
        attn_ml: poisoned(g, aml),
        argmax_v: poisoned(g, am),
        argmax_i: g.stream.clone_htod(&vec![u32::MAX; am]).unwrap(),
        argmax_tickets: g.stream.alloc_zeros(at).unwrap(),
    }
}

#[test]
fn confidence_logits_of_several_rows() {
    let g = gpu();
    let mut rng = Rng(14);
    let (rows, hd, r) = (7usize, 4096usize, 256usize);
    let (h, e, w) = (rng.vec(rows * hd), rng.vec(rows * r), rng.vec(hd + r));
    let (hd_, ed, wd) = (up(&g, &h), up(&g, &e), up(&g, &w));
    for with_markov in [false, true] {
        let mut out = poisoned(&g, rows);
        g.confidence(
            &wd.as_view(),
            0.25,
            &hd_.as_view(),
            &ed.as_view(),
            (rows, hd, r),
            with_markov,
            &mut out.as_view_mut(),
        )
        .unwrap();
        let want: Vec<f32> = (0..rows)
            .map(|s| {
                let mut acc: f64 = h[s * hd..][..hd].iter().zip(&w).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
                if with_markov {
                    acc += e[s * r..][..r].iter().zip(&w[hd..]).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>();
                }
                (acc + 0.25) as f32
            })
            .collect();
        let err = rel_err(&down(&g, &out), &want);
        assert!(err <= 1e-5, "confidence with_markov={with_markov}: rel err {err}");
    }
}

/// The launch policy: on sm_90+ every PDL-capable kernel launches with PDL except the no-PDL
/// list (unless the environment overrides it for an A/B run): the combine after the tensor-core
/// attention and the SwiGLU matvec; the decode's combine twin is not on it.
#[test]
fn pdl_policy_leaves_out_the_combine_and_swiglu() {
    let g = gpu();
    if g.ptx != dspark_kernels::cuda::PtxTarget::Sm90 || std::env::var_os("DSPARK_NO_PDL").is_some() {
        assert!(!g.pdl_for("matvec_tc_bf16"), "no PDL without the sm_90 PTX or with DSPARK_NO_PDL");
        return;
    }
    if std::env::var_os("DSPARK_NO_PDL_FOR").is_some() {
        return; // an A/B run's own list
    }
    for name in [
        "matvec_tc_bf16",
        "matvec_tc_u4_bf16",
        "attention_tc_hd128_f32",
        "qkv_rope_append_f32",
        "attention_combine_q1_f32",
    ] {
        assert!(g.pdl_for(name), "{name} should launch with PDL");
    }
    for name in ["attention_combine_f32", "matvec_tc_swiglu_bf16"] {
        assert!(!g.pdl_for(name), "{name} should launch without PDL");
    }
}

/// Strided rows copied exactly, the columns past `cols` untouched: rows of the element loop (70
/// columns; a destination not 16-byte aligned) and of float4s issued all at once (4,120 columns:
/// a second, partial pass of the block's 256 threads × 4).
#[test]
fn copy_rows_strided() {
    let g = gpu();
    let mut rng = Rng(14);
    for (rows, cols, ss, ds, at) in [(5, 70, 80, 210, 140), (3, 4120, 4200, 8400, 144), (2, 64, 64, 128, 141)] {
        let src = rng.vec(rows * ss);
        let sd = up(&g, &src);
        let mut dd = poisoned(&g, at + rows * ds);
        g.copy_rows(&sd.as_view(), &mut dd.slice_mut(at..), rows, cols, (ss, ds)).unwrap();
        let got = down(&g, &dd);
        assert!(got[..at].iter().all(|x| x.is_nan()), "{cols}: before the rows");
        for r in 0..rows {
            assert_eq!(&got[at + r * ds..][..cols], &src[r * ss..][..cols], "{cols}: row {r}");
            assert!(got[at + r * ds + cols..][..ds - cols].iter().all(|x| x.is_nan()), "{cols}: past row {r}");
        }
    }
}

#[test]
fn embedding_and_gather_row() {
    let g = gpu();
    let mut rng = Rng(3);
    // 64 and 4,096 bf16 values: whole 16-byte chunks (every load of a row in flight at once); 60
    // bf16 and 30 f32 values: the element loop.
    let cases = [(50, 64, "bf16"), (50, 60, "bf16"), (40, 30, "f32"), (40, 2056, "f32"), (151936, 4096, "bf16")];
    for (vocab, dim, dtype) in cases.into_iter().filter(|s| full_size() || s.0 < 1000) {
        let (t, tf) = weight(&g, &rng.vec(vocab * dim), dtype);
        let ids: Vec<u32> = vec![0, (vocab - 1) as u32, 7, 7, 31];
        let idd = g.stream.clone_htod(&ids).unwrap();
        let mut out = poisoned(&g, ids.len() * dim);
        g.embedding(&t, dim, &idd.as_view(), ids.len(), &mut out.as_view_mut()).unwrap();
        let want: Vec<f32> = ids.iter().flat_map(|&i| tf[i as usize * dim..][..dim].to_vec()).collect();
        assert_eq!(down(&g, &out), want);
        let mut row = poisoned(&g, dim);
        g.gather_row(&t, dim, &idd.slice(1..2), &mut row.as_view_mut()).unwrap();
        assert_eq!(down(&g, &row), tf[(vocab - 1) * dim..][..dim].to_vec());
    }
}

/// The embedding from a table in mapped host memory (`HostTable`, on the `embedding_*` kernels) equals the
/// device table's rows exactly, in every dtype, for row widths of one 16-byte chunk, of a partial
/// last pass (200 bf16 values: 25 chunks) and of more than one pass of the block (9,000 f32
/// values: 2,250 chunks, past 256 threads × 4), with repeated, first and last ids. A row that is
/// not whole 16-byte chunks is refused, not read out of line.
#[test]
fn host_table_embedding_equals_the_device_tables() {
    use dspark_kernels::cuda::host_table::HostTable;
    let g = gpu();
    let mut rng = Rng(33);
    let cases = [(40, 8, "bf16"), (64, 200, "bf16"), (33, 24, "f16"), (20, 9000, "f32"), (151936, 4096, "bf16")];
    for (vocab, dim, dtype) in cases.into_iter().filter(|s| full_size() || s.0 < 1000) {
        let (t, tf) = weight(&g, &rng.vec(vocab * dim), dtype);
        let bytes: Vec<u8> = match &t {
            WeightBuf::Bf16(s) | WeightBuf::F16(s) => {
                g.stream.clone_dtoh(s).unwrap().iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            WeightBuf::F32(s) => g.stream.clone_dtoh(s).unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
            WeightBuf::Fp8(_) => unreachable!(),
        };
        let host = HostTable::from_bytes(&g.ctx, dtype, &bytes).unwrap();
        assert_eq!(host.bytes(), bytes.len());
        let ids: Vec<u32> = vec![0, (vocab - 1) as u32, 7, 7, rng.below(vocab) as u32, 3];
        let idd = g.stream.clone_htod(&ids).unwrap();
        let mut out = poisoned(&g, ids.len() * dim);
        g.embedding(&host, dim, &idd.as_view(), ids.len(), &mut out.as_view_mut()).unwrap();
        let want: Vec<f32> = ids.iter().flat_map(|&i| tf[i as usize * dim..][..dim].to_vec()).collect();
        let got = down(&g, &out);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{dtype} {vocab}x{dim}"
        );
        // The Markov W1 row gather (one row of the same kernel) from the host table.
        let mut row = poisoned(&g, dim);
        g.gather_row(&host, dim, &idd.slice(4..5), &mut row.as_view_mut()).unwrap();
        assert_eq!(down(&g, &row), tf[ids[4] as usize * dim..][..dim].to_vec(), "gather_row {dtype} {vocab}x{dim}");
    }
    // 50 bf16 values a row are 100 bytes: not whole chunks. The embedding refuses them; the one
    // row gather_row takes reads them by its element loop.
    let vals: Vec<u16> = (0..50 * 4).map(|i| half::bf16::from_f32(i as f32).to_bits()).collect();
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let host = HostTable::from_bytes(&g.ctx, "bf16", &bytes).unwrap();
    let idd = g.stream.clone_htod(&[1u32]).unwrap();
    let mut out = poisoned(&g, 50);
    let e = g.embedding(&host, 50, &idd.as_view(), 1, &mut out.as_view_mut()).unwrap_err();
    assert!(e.to_string().contains("16-byte"), "{e}");
    g.gather_row(&host, 50, &idd.as_view(), &mut out.as_view_mut()).unwrap();
    assert_eq!(down(&g, &out), (50..100).map(|i| i as f32).collect::<Vec<_>>());
    assert!(HostTable::from_bytes(&g.ctx, "fp8", &[0u8; 16]).is_err());
}

/// Tensor parallel's ops (`cuda/tp.rs`): a vocabulary shard's embedding (rows of ids inside the
/// shard from its table, zeros outside, bit for bit, in every dtype), the residual add, and each
/// row's value at an index, on poisoned outputs.
#[test]
fn tp_kernels_match_their_references() {
    let g = gpu();
    let mut rng = Rng(34);
    for (vocab, dim, dtype, lo, hi) in [(40, 8, "bf16", 10, 25), (33, 24, "f16", 0, 11), (20, 300, "f32", 13, 20)] {
        let (t, tf) = weight(&g, &rng.vec((hi - lo) * dim), dtype);
        let ids: Vec<u32> = vec![lo as u32, (hi - 1) as u32, 0, (vocab - 1) as u32, hi as u32, rng.below(vocab) as u32];
        let idd = g.stream.clone_htod(&ids).unwrap();
        let mut out = poisoned(&g, ids.len() * dim);
        g.embedding_shard(&t, dim, &idd.as_view(), ids.len(), lo..hi, &mut out.as_view_mut()).unwrap();
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                let i = i as usize;
                if (lo..hi).contains(&i) {
                    tf[(i - lo) * dim..][..dim].to_vec()
                } else {
                    vec![0.0; dim]
                }
            })
            .collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&down(&g, &out)), bits(&want), "embedding_shard {dtype} rows {lo}..{hi}");
    }
    for n in [1usize, 255, 4096 * 8 + 3] {
        let (a, b) = (rng.vec(n), rng.vec(n));
        let mut x = up(&g, &a);
        g.add_into(&mut x.as_view_mut(), &up(&g, &b).as_view()).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(p, q)| p + q).collect();
        assert_eq!(down(&g, &x), want, "add_into of {n}");
    }
    let (rows, stride) = (7usize, 1000usize);
    let x = rng.vec(rows * stride);
    let idx: Vec<u32> = (0..rows).map(|_| rng.below(stride) as u32).collect();
    let mut out = poisoned(&g, rows);
    g.take_at(
        &up(&g, &x).as_view(),
        &g.stream.clone_htod(&idx).unwrap().as_view(),
        stride,
        rows,
        &mut out.as_view_mut(),
    )
    .unwrap();
    let want: Vec<f32> = idx.iter().enumerate().map(|(r, &i)| x[r * stride + i as usize]).collect();
    assert_eq!(down(&g, &out), want);
}

#[test]
fn rmsnorm_matches_reference() {
    let g = gpu();
    let mut rng = Rng(4);
    // float4 path (dim % 4 == 0, ≤ 4096, aligned) and the strided loop (odd dims, wider rows,
    // and x starting one float into its buffer, so not 16-byte aligned).
    let cases = [(1, 64, 0), (3, 100, 0), (8, 4096, 0), (2, 6, 0), (2, 5120, 0), (3, 100, 1)];
    for (rows, dim, skew) in cases.into_iter().filter(|s| full_size() || s.1 < 1000) {
        let x = rng.vec(rows * dim + skew);
        let w = rng.vec(dim);
        let want = cpu::rmsnorm::rmsnorm(&x[skew..], &w, 1e-6);
        let (xd, wd) = (up(&g, &x), up(&g, &w));
        let mut out = poisoned(&g, rows * dim);
        g.rmsnorm(&xd.slice(skew..), &wd.as_view(), 1e-6, rows, &mut out.as_view_mut()).unwrap();
        assert!(rel_err(&down(&g, &out), &want) <= 1e-5, "rmsnorm {rows}x{dim} skew {skew}");
    }
}

#[test]
fn shape_checks_refuse_short_buffers() {
    let g = gpu();
    let x = up(&g, &[0.0; 10]);
    let (w, _) = weight(&g, &[0.0; 20], "f32");
    let mut y = poisoned(&g, 1);
    assert!(g.matvec(&w, &x.as_view(), &mut y.as_view_mut(), (1, 10, 2), false).is_err());
}

#[path = "gpu_kernels/argmax.rs"]
mod argmax;

#[path = "gpu_kernels/attention.rs"]
mod attention;

#[path = "gpu_kernels/attention_prefill.rs"]
mod attention_prefill;

#[path = "gpu_kernels/matvec.rs"]
mod matvec;

#[path = "gpu_kernels/norm_fold.rs"]
mod norm_fold;

#[path = "gpu_kernels/fp8.rs"]
mod fp8;

#[path = "gpu_kernels/kv_layers.rs"]
mod kv_layers;

#[path = "gpu_kernels/markov_step.rs"]
mod markov_step;

#[path = "gpu_kernels/rope_fold.rs"]
mod rope_fold;

#[path = "gpu_kernels/row_gemm.rs"]
mod row_gemm;

#[path = "gpu_kernels/sample.rs"]
mod sample;

#[path = "gpu_kernels/wide.rs"]
mod wide;
