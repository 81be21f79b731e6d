//! Block-scaled FP8 weights in the prefill's GEMM (`Gpu::gemm` on a `WeightBuf::Fp8`): each
//! weight widened to bf16 by `dequant_fp8_bf16` in the handle's scratch, then cuBLAS with bf16
//! activations and f32 accumulation. (The small-M FP8 matvecs are checked with every other dtype
//! in `gpu_kernels.rs` and `norm_fold.rs`, through `weight_cols`; here, what is theirs alone.)
//!
//! * The tensor-core FP8 matvec's rows do not depend on the batch: each row of an 8-row launch
//!   (two n-tiles of (row, part) columns) equals the same row launched alone or in a pair (the
//!   one-n-tile `_n1_fp8` kernels) bit for bit — the lossless invariant rests on it — for rows
//!   whose ranges force every scaling x gets before its f16 split (largest |x| from 1e-30 to
//!   3e6, an all-zero row, a row spanning 12 decades), each within 1e-5 of the f32 reference. A
//!   row alone runs both ways: split inside the matvec's own blocks (`_n1x_fp8`, no split launch)
//!   and split by `split_x_f16x2` first (`_n1_fp8`), both those bits.
//! * The splits' own forms, bit for bit: the eight-row split one block a row against the
//!   two-pass grid, and the one-row split in the block against the split launch, at widths on
//!   both sides of each form's one-read bound.
//!
//! * The widening exactly: an identity activation matrix makes the GEMM's output the widened
//!   weights themselves (one nonzero product per output), which must equal
//!   `round_bf16(e4m3 · scale)` exactly (as values: a −0 weight sums to +0).
//! * The GEMM against the f32 reference fed the same bf16-rounded operands: 3e-5 relative (the
//!   products are exact in f32; only the order of the f32 sums differs, and K reaches 12,288:
//!   1.3e-5 measured there).
//! * Qwen3-8B's gate|up and down shapes at a prefill chunk of 512 rows, and the accumulate mode.
//! * A scratch smaller than the weight: tiles of whole scale blocks, tiles of fewer rows than a
//!   block, and a scratch of less than a row refused.

use super::*;
use dspark_kernels::cuda::gemm::{Blas, GemmIn, WORKSPACE_BYTES};

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect()
}

fn rounded(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| cpu::round_bf16(*x)).collect()
}

fn blas(g: &Gpu, largest: usize) -> Blas {
    Blas::new(g, g.stream.alloc_zeros::<u8>(WORKSPACE_BYTES).unwrap())
        .unwrap()
        .with_dequant(g.stream.alloc_zeros::<u16>(largest).unwrap())
}

/// `w` times rows `rows` of `x` (rows of `d_in`), x split (or quantized) inside the matvec's own
/// blocks where one row allows (`in_block`) or by a launch before it: the outputs (poisoned
/// first) and the kernels that ran.
fn run_rows(
    g: &mut Gpu,
    w: &WeightBuf,
    x: &[f32],
    (d_in, d_out): (usize, usize),
    rows: std::ops::Range<usize>,
    in_block: bool,
) -> (Vec<f32>, Vec<String>) {
    g.fp8_split_in_block = in_block;
    let m = rows.len();
    let xd = up(g, &x[rows.start * d_in..rows.end * d_in]);
    let mut y = poisoned(g, m * d_out);
    let ran = kernels_run(g, |g| g.matvec(w, &xd.as_view(), &mut y.as_view_mut(), (m, d_in, d_out), false).unwrap());
    g.fp8_split_in_block = true;
    (down(g, &y), ran)
}

/// Eight rows of x whose ranges differ: |x| up to 1, 3e6, `tiny`, an all-zero row, 1, one
/// spanning 12 decades, 7e4 and 1e-3 — the batch a row's bits must not depend on.
fn ranged_rows(rng: &mut Rng, d_in: usize, tiny: f32) -> Vec<f32> {
    let mut x = Vec::with_capacity(8 * d_in);
    for r in 0..8 {
        let scale = [1.0f32, 3e6, tiny, 0.0, 1.0, 7e4, 1e-3, 1.0][r];
        x.extend(rng.vec(d_in).iter().enumerate().map(|(k, v)| {
            if r == 4 {
                v * 10f32.powi((k % 13) as i32 - 6)
            } else {
                v * scale
            }
        }));
    }
    x
}

#[test]
fn fp8_matvec_rows_do_not_depend_on_the_batch_or_their_range() {
    let mut g = gpu();
    let mut rng = Rng(29);
    let shapes: &[(usize, usize, &str)] =
        if full_size() { &[(256, 48, "fp8b"), (4096, 1024, "fp8"), (12288, 512, "fp8")] } else { &[(256, 48, "fp8b")] };
    for &(d_in, d_out, dtype) in shapes {
        let (w, wf) = weight_cols(&g, &rng.vec(d_out * d_in), d_in, dtype);
        let x = ranged_rows(&mut rng, d_in, 1e-30);
        let want = cpu::matmul::linear(&x, &wf, 8, d_in, d_out);
        let run = |g: &mut Gpu, rows: std::ops::Range<usize>, in_block: bool| {
            run_rows(g, &w, &x, (d_in, d_out), rows, in_block)
        };
        let (all, ran) = run(&mut g, 0..8, true);
        assert!(ran.iter().any(|k| k.starts_with("matvec_tc") && !k.contains("_n1")), "8 rows ran {ran:?}");
        for r in 0..8 {
            let (got, want_r) = (&all[r * d_out..][..d_out], &want[r * d_out..][..d_out]);
            let e = rel_err(got, want_r);
            assert!(
                e <= 1e-5 || want_r.iter().all(|v| *v == 0.0) && got.iter().all(|v| *v == 0.0),
                "{dtype} {d_in}->{d_out} row {r}: rel err {e}"
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (one, ran) = run(&mut g, r..r + 1, false);
            assert!(ran.iter().any(|k| k.ends_with("_n1_fp8")), "1 row, split launch: ran {ran:?}");
            assert_eq!(bits(&one), bits(got), "{dtype} {d_in}->{d_out} row {r}: alone differs from the batch of 8");
            let (one, ran) = run(&mut g, r..r + 1, true);
            assert!(
                ran.iter().any(|k| k.ends_with("_n1x_fp8")) && !ran.iter().any(|k| k.starts_with("split_x_f16x2")),
                "1 row, split in the block: ran {ran:?}"
            );
            assert_eq!(bits(&one), bits(got), "{dtype} {d_in}->{d_out} row {r}: split in the block differs");
            if r % 2 == 0 {
                let (pair, _) = run(&mut g, r..r + 2, true);
                assert_eq!(bits(&pair), bits(&all[r * d_out..][..2 * d_out]), "rows {r}, {}: the pair differs", r + 1);
            }
        }
    }
}

/// The one-block-a-row split (`split_x_f16x2_row`) against the two-pass split it replaces
/// (`split_x_f16x2`, which finds each row's largest |x| in every block and then reads the row
/// again): the eight-row matvec after each, bit for bit, on rows of very different scales; rows
/// wider than 1024 threads of eight groups of four hold (32,896) take the two-pass split.
#[test]
fn fp8_split_row_equals_the_two_pass_split() {
    let mut g = gpu();
    let mut rng = Rng(31);
    let widths: &[usize] = if full_size() { &[256, 4096, 12288, 25600, 32896] } else { &[256, 4224] };
    for &d_in in widths {
        let d_out = 32;
        let (w, _) = weight_cols(&g, &rng.vec(d_out * d_in), d_in, "fp8");
        let x: Vec<f32> = (0..8)
            .flat_map(|r| {
                let scale = [1.0f32, 3e6, 1e-30, 0.0, 1.0, 7e4, 1e-3, 0.25][r];
                rng.vec(d_in).into_iter().map(move |v| v * scale)
            })
            .collect();
        let xd = up(&g, &x);
        let run = |g: &mut Gpu, row: bool| -> (Vec<u32>, Vec<String>) {
            g.fp8_split_row = row;
            let mut y = poisoned(g, 8 * d_out);
            let ran =
                kernels_run(g, |g| g.matvec(&w, &xd.as_view(), &mut y.as_view_mut(), (8, d_in, d_out), false).unwrap());
            g.fp8_split_row = true;
            (down(g, &y).iter().map(|v| v.to_bits()).collect(), ran)
        };
        let (two_pass, ran) = run(&mut g, false);
        assert!(ran.iter().any(|k| k == "split_x_f16x2"), "{d_in}: two-pass split ran {ran:?}");
        assert!(two_pass.iter().all(|b| f32::from_bits(*b).is_finite()), "{d_in}: unwritten or non-finite outputs");
        let (row, ran) = run(&mut g, true);
        let want = if d_in <= 4 * 8 * 1024 { "split_x_f16x2_row" } else { "split_x_f16x2" };
        assert!(ran.iter().any(|k| k == want), "{d_in}: wanted {want}, ran {ran:?}");
        assert_eq!(row, two_pass, "{d_in}: the one-block-a-row split changes the matvec's bits");
    }
}

#[test]
fn fp8_gemm_widens_each_weight_once_to_bf16() {
    let g = gpu();
    let mut rng = Rng(71);
    for (dtype, n, k) in [("fp8", 48usize, 256usize), ("fp8b", 40, 192), ("fp8s", 24, 36)] {
        let (w, wf) = weight_cols(&g, &rng.vec(n * k), k, dtype);
        let b = blas(&g, n * k);
        let eye: Vec<f32> = (0..k * k).map(|i| if i / k == i % k { 1.0 } else { 0.0 }).collect();
        let x = g.stream.clone_htod(&bf16_bits(&eye)).unwrap();
        let mut y = poisoned(&g, k * n);
        g.gemm(&b, &w, &GemmIn::Half(x.slice(..)), &mut y.as_view_mut(), (k, k, n), false).unwrap();
        let got = down(&g, &y);
        // y[m, o] = W[o, m]: the widened weight itself.
        for o in 0..n {
            for m in 0..k {
                let want = cpu::round_bf16(wf[o * k + m]);
                assert_eq!(got[m * n + o], want, "{dtype} {n}x{k}: W[{o}, {m}]");
            }
        }
    }
}

#[test]
fn fp8_gemm_matches_the_rounded_reference() {
    let g = gpu();
    let mut rng = Rng(73);
    let shapes = [(37usize, 128usize, 80usize), (200, 264, 128), (512, 4096, 24576), (512, 12288, 4096)];
    for &(m, k, n) in shapes.iter().filter(|s| full_size() || s.1 * s.2 <= 1 << 16) {
        let dtype = if k % 128 == 0 { "fp8" } else { "fp8s" };
        let (w, wf) = weight_cols(&g, &rng.vec(n * k), k, dtype);
        let b = blas(&g, n * k);
        let x = rng.vec(m * k);
        let xd = g.stream.clone_htod(&bf16_bits(&x)).unwrap();
        let want = cpu::matmul::linear(&rounded(&x), &rounded(&wf), m, k, n);
        let mut y = poisoned(&g, m * n);
        g.gemm(&b, &w, &GemmIn::Half(xd.slice(..)), &mut y.as_view_mut(), (m, k, n), false).unwrap();
        let e = rel_err(&down(&g, &y), &want);
        assert!(e <= 3e-5, "fp8 gemm {m}x{k}->{n}: rel err {e}");
        let base = rng.vec(m * n);
        let mut y = up(&g, &base);
        g.gemm(&b, &w, &GemmIn::Half(xd.slice(..)), &mut y.as_view_mut(), (m, k, n), true).unwrap();
        let want_acc: Vec<f32> = want.iter().zip(&base).map(|(a, b)| a + b).collect();
        let e = rel_err(&down(&g, &y), &want_acc);
        assert!(e <= 3e-5, "fp8 gemm accumulate {m}x{k}->{n}: rel err {e}");
    }
    // A scratch smaller than the weight: widened and multiplied in tiles of whole 128-row scale
    // blocks (5 × 128 + 40 rows here), one of fewer rows than a block (100-row scratch: tiles
    // of 100, whose scale rows straddle blocks), or refused when it holds less than a row.
    let (m, k, n) = (64usize, 256usize, 680usize);
    let (w, wf) = weight_cols(&g, &rng.vec(n * k), k, "fp8");
    let x = rng.vec(m * k);
    let xd = g.stream.clone_htod(&bf16_bits(&x)).unwrap();
    let want = cpu::matmul::linear(&rounded(&x), &rounded(&wf), m, k, n);
    let base = rng.vec(m * n);
    let want_acc: Vec<f32> = want.iter().zip(&base).map(|(a, b)| a + b).collect();
    for rows in [128 * 2 + 7, 100] {
        assert_eq!(
            dspark_kernels::cuda::gemm::dequant_tile_rows(rows * k, n, k),
            Some(if rows > 128 { 256 } else { 100 })
        );
        let b = blas(&g, rows * k);
        let mut y = poisoned(&g, m * n);
        g.gemm(&b, &w, &GemmIn::Half(xd.slice(..)), &mut y.as_view_mut(), (m, k, n), false).unwrap();
        let e = rel_err(&down(&g, &y), &want);
        assert!(e <= 3e-5, "fp8 gemm in tiles of a {rows}-row scratch: rel err {e}");
        let mut y = up(&g, &base);
        g.gemm(&b, &w, &GemmIn::Half(xd.slice(..)), &mut y.as_view_mut(), (m, k, n), true).unwrap();
        let e = rel_err(&down(&g, &y), &want_acc);
        assert!(e <= 3e-5, "fp8 gemm accumulate in tiles of a {rows}-row scratch: rel err {e}");
    }
    let tiny = blas(&g, k - 1);
    let mut y = poisoned(&g, m * n);
    let e = g.gemm(&tiny, &w, &GemmIn::Half(xd.slice(..)), &mut y.as_view_mut(), (m, k, n), false).unwrap_err();
    assert!(e.to_string().contains("scratch"), "{e}");

    // A handle without the scratch refuses an FP8 weight with an error, not a fault.
    let (w, _) = weight_cols(&g, &rng.vec(32 * 64), 64, "fp8");
    let plain = Blas::new(&g, g.stream.alloc_zeros::<u8>(WORKSPACE_BYTES).unwrap()).unwrap();
    let x = g.stream.alloc_zeros::<u16>(4 * 64).unwrap();
    let mut y = poisoned(&g, 4 * 32);
    let e = g.gemm(&plain, &w, &GemmIn::Half(x.slice(..)), &mut y.as_view_mut(), (4, 64, 32), false).unwrap_err();
    assert!(e.to_string().contains("dequant"), "{e}");
}

/// The one-row split inside the matvec's blocks (fp8.cuh `split_x_block`: rows of up to 4 · Q ·
/// 256 values read once and split from registers, Q = 12 on the UNROLL-4 kernels and 4 on the
/// others; wider rows read twice) against the split launch before the `_n1` kernel, bit for bit,
/// on every FP8 one-row kernel shape at widths on both sides of each kernel's bound: 4,096 and
/// 12,288 (Qwen3-8B's), 17,408 (Qwen3-14B's down_proj), on rows from 1e-30 to 3e6.
#[test]
fn fp8_split_in_block_equals_the_split_launch_at_every_width() {
    let mut g = gpu();
    let mut rng = Rng(37);
    let widths: &[usize] = if full_size() { &[256, 4096, 4352, 12288, 17408] } else { &[256, 4224] };
    for &d_in in widths {
        let d_out = 256;
        let (w, _) = weight_cols(&g, &rng.vec(d_out * d_in), d_in, "fp8");
        for (r, scale) in [1.0f32, 3e6, 1e-30].into_iter().enumerate() {
            let x: Vec<f32> = rng.vec(d_in).into_iter().map(|v| v * scale).collect();
            let xd = up(&g, &x);
            for kernel in ["matvec_tc_fp8", "matvec_tc_u4_fp8", "matvec_tc_u4b1_fp8"] {
                let mut run = |in_block: bool| -> (Vec<u32>, Vec<String>) {
                    g.fp8_split_in_block = in_block;
                    let mut y = poisoned(&g, d_out);
                    let shape = (1, d_in, d_out);
                    let ran = kernels_run(&g, |g| {
                        g.matvec_tc_variant(kernel, &w, &xd.as_view(), &mut y.as_view_mut(), shape).unwrap()
                    });
                    g.fp8_split_in_block = true;
                    (down(&g, &y).iter().map(|v| v.to_bits()).collect(), ran)
                };
                let (launch, ran) = run(false);
                assert!(ran.iter().any(|k| k.starts_with("split_x_f16x2")), "{kernel} {d_in}: ran {ran:?}");
                assert!(launch.iter().all(|b| f32::from_bits(*b).is_finite()), "{kernel} {d_in}: unwritten outputs");
                let (block, ran) = run(true);
                // Where a kernel's blocks an SM cannot each hold the split row (4 bytes a value:
                // three blocks of 12,288 on a 100 KB SM), it keeps the split launch; the one-block
                // kernel holds every width here on any sm_80+ GPU, and every kernel 4,352 values.
                let in_block =
                    ran.iter().any(|k| k.ends_with("_n1x_fp8")) && !ran.iter().any(|k| k.starts_with("split_x"));
                let must = kernel == "matvec_tc_u4b1_fp8" || d_in <= 4352;
                assert!(in_block || !must, "{kernel} {d_in}: ran {ran:?}");
                assert_eq!(block, launch, "{kernel} {d_in} row {r}: the split in the block changes the bits");
            }
        }
    }
}

/// The E4M3 byte nearest to `x` (ties to the even code), saturating at ±448: the kernels'
/// `cvt.rn.satfinite.e4m3x2.f32` (a table search; x is never NaN here).
fn e4m3_rn_sat(x: f32) -> u8 {
    let mut best = 0u8;
    for b in 1..=0x7eu8 {
        let (e, eb) = ((cpu::fp8::e4m3_to_f32(b) - x.abs()).abs(), (cpu::fp8::e4m3_to_f32(best) - x.abs()).abs());
        if e < eb || (e == eb && b & 1 == 0) {
            best = b;
        }
    }
    if x < 0.0 && best != 0 {
        best | 0x80
    } else {
        best
    }
}

/// E4M3 activations (experiment `DSPARK_FP8_A8=1`, `Gpu::fp8_a8`; kernels/fp8.cuh): x quantized
/// per row and 128-wide group (s = max|x| / 448, x / s rounded to the nearest E4M3, saturating),
/// multiplied on E4M3 MMAs. Each row of an 8-row launch equals the row alone — quantized in the
/// matvec's blocks (`_a8x`) and by `quant_x_e4m3` first — and in a pair, bit for bit; each is
/// within 2e-5 of Σ|w·x| of the f64 sum over the same quantized x (the CPU quantizes with the
/// same f32 arithmetic), and within 1/16 of it of the sum over x itself (E4M3's 3 bits). It runs
/// on the sm_90 and sm_89 builds (`DSPARK_PTX=sm89`); on the sm_80 PTX, which has no such
/// kernels, the flag must change nothing.
#[test]
fn fp8_e4m3_activations_match_their_reference_and_not_the_batch() {
    let mut g = gpu();
    let mut rng = Rng(37);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    if !g.ptx.e4m3_mma() {
        // The sm_80 PTX (`DSPARK_PTX=sm80`, or a GPU before Ada) has no E4M3 kernels: the flag
        // must leave the W8A16 kernels in place, bit for bit, and the mode is refused by name.
        let (w, _) = weight_cols(&g, &rng.vec(48 * 256), 256, "fp8");
        let x = rng.vec(8 * 256);
        g.fp8_a8 = true;
        let (on, ran) = run_rows(&mut g, &w, &x, (256, 48), 0..8, true);
        assert!(!ran.iter().any(|k| k.contains("_a8") || k == "quant_x_e4m3"), "the sm_80 PTX ran {ran:?}");
        g.fp8_a8 = false;
        let (off, _) = run_rows(&mut g, &w, &x, (256, 48), 0..8, true);
        assert_eq!(bits(&on), bits(&off), "the flag changed the sm_80 PTX's bits");
        let e = g.set_activations(dspark_kernels::Activations::E4m3).unwrap_err().to_string();
        assert!(e.contains("--activations e4m3") && e.contains("runs the sm_80 kernels"), "{e}");
        return;
    }
    g.fp8_a8 = true;
    let shapes: &[(usize, usize)] =
        if full_size() { &[(4096, 1024), (12288, 256), (256, 48)] } else { &[(256, 48), (1024, 80)] };
    for &(d_in, d_out) in shapes {
        let (w, wf) = weight_cols(&g, &rng.vec(d_out * d_in), d_in, "fp8");
        let x = ranged_rows(&mut rng, d_in, 1e-20);
        // The quantized x, dequantized (exact in f64): per row and group, q · s.
        let mut xdq = vec![0f64; 8 * d_in];
        for r in 0..8 {
            for g0 in (0..d_in).step_by(128) {
                let grp = &x[r * d_in + g0..r * d_in + g0 + 128];
                let s = grp.iter().fold(0f32, |a, v| a.max(v.abs())) / 448.0;
                for (k, v) in grp.iter().enumerate() {
                    xdq[r * d_in + g0 + k] =
                        if s > 0.0 { cpu::fp8::e4m3_to_f32(e4m3_rn_sat(v / s)) as f64 * s as f64 } else { 0.0 };
                }
            }
        }
        let run = |g: &mut Gpu, rows: std::ops::Range<usize>, in_block: bool| {
            run_rows(g, &w, &x, (d_in, d_out), rows, in_block)
        };
        let (all, ran) = run(&mut g, 0..8, true);
        assert!(
            ran.iter().any(|k| k.ends_with("_a8_fp8")) && ran.iter().any(|k| k == "quant_x_e4m3"),
            "8 rows ran {ran:?}"
        );
        let (mut worst_q, mut worst_x) = (0f64, 0f64);
        for r in 0..8 {
            for o in 0..d_out {
                let wr = &wf[o * d_in..][..d_in];
                let (mut yq, mut yx, mut mag) = (0f64, 0f64, 0f64);
                for k in 0..d_in {
                    yq += wr[k] as f64 * xdq[r * d_in + k];
                    yx += wr[k] as f64 * x[r * d_in + k] as f64;
                    mag += (wr[k] as f64 * x[r * d_in + k] as f64).abs();
                }
                let got = all[r * d_out + o] as f64;
                assert!(got.is_finite(), "{d_in}->{d_out} row {r} out {o}: {got} (unwritten?)");
                if mag > 0.0 {
                    worst_q = worst_q.max((got - yq).abs() / mag);
                    worst_x = worst_x.max((got - yx).abs() / mag);
                } else {
                    assert_eq!(got, 0.0, "{d_in}->{d_out} row {r}: a zero row's output");
                }
            }
            let got = &all[r * d_out..][..d_out];
            let (one, ran) = run(&mut g, r..r + 1, false);
            assert!(ran.iter().any(|k| k == "quant_x_e4m3"), "1 row, quant launch: ran {ran:?}");
            assert_eq!(bits(&one), bits(got), "{d_in}->{d_out} row {r}: alone differs from the batch of 8");
            let (one, ran) = run(&mut g, r..r + 1, true);
            assert!(
                ran.iter().any(|k| k.ends_with("_a8x_fp8")) && !ran.iter().any(|k| k == "quant_x_e4m3"),
                "1 row, quantized in the block: ran {ran:?}"
            );
            assert_eq!(bits(&one), bits(got), "{d_in}->{d_out} row {r}: quantized in the block differs");
            if r % 2 == 0 {
                let (pair, _) = run(&mut g, r..r + 2, true);
                assert_eq!(bits(&pair), bits(&all[r * d_out..][..2 * d_out]), "rows {r}, {}: the pair differs", r + 1);
            }
        }
        eprintln!("{d_in}->{d_out}: E4M3 x, error / Σ|w·x|: {worst_q:.2e} against its own arithmetic, {worst_x:.2e} against f32 x");
        assert!(worst_q <= 2e-5, "{d_in}->{d_out}: {worst_q:e} against the quantized x's sums");
        assert!(worst_x <= 1.0 / 16.0, "{d_in}->{d_out}: {worst_x:e} against f32 x");
    }
}
