//! The wide matvec kernels (16 or 32 rows a launch on one weight read, `Gpu::wide`) against
//! the 8-row kernels they stand in for: every output bit for bit — plain products on each of the
//! three tensor-core shapes (Qwen3-8B's q|k|v, o / down, one layer's k|v), the SwiGLU epilogue,
//! and both sides of the RMSNorm fold (the producer's residual, x·γ and partial sums of
//! squares; the consumer scaling by 1/rms) — at row counts that split into wide and 8-row
//! launches. Outputs are poisoned first, and held to the f32 reference at 1e-5 as well. The
//! same on FP8 weights (`_w2_fp8`, `_w4_fp8`) in two block layouts, with rows eight decades
//! apart, so each group's rows must take their own x scales.
//! Each also runs with x rounded to bf16 (`Gpu::activations` bf16, the one-part `_x1` kernels and their
//! 64-row twins): wide launches against 8-row ones bit for bit, every row against the same row
//! launched alone, and the products against the reference fed the rounded x. In that mode a
//! norm producer may store bf16 rows for its consumer (`_x1h` kernels): every output the same
//! bits as with f32 rows, and the stored rows the f32 rows rounded. The mode's wide launches run
//! twice: on the split kernels, which stage x once per block of 8 tiles and add the K split's
//! partial sums across blocks (kernels/matvec_split.cu, `Gpu::wide_split`), and on matvec.cu's.

use super::*;
use dspark_kernels::cuda::norm_fold::Normed;
use dspark_kernels::Activations;

const ROWS: [usize; 6] = [9, 16, 23, 32, 40, 64];

/// Runs `f` with the wide kernels on, then off, on freshly poisoned outputs of `lens`; returns
/// both runs' outputs.
fn both(g: &mut Gpu, lens: &[usize], mut f: impl FnMut(&Gpu, &mut [CudaSlice<f32>])) -> [Vec<Vec<f32>>; 2] {
    let mut run = |g: &mut Gpu, wide: bool| {
        g.wide = wide;
        let mut outs: Vec<CudaSlice<f32>> = lens.iter().map(|&n| poisoned(g, n)).collect();
        f(g, &mut outs);
        outs.iter().map(|o| down(g, o)).collect::<Vec<_>>()
    };
    let wide = run(g, true);
    let eight = run(g, false);
    g.wide = true;
    [wide, eight]
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// x rounded to the nearest bf16, as the `_x1` kernels feed it to the MMAs.
/// bf16 rows a kernel packed into an f32 buffer (two values a slot, the first in the low
/// half), widened to f32.
fn widen_bf16_rows(packed: &[f32]) -> Vec<f32> {
    packed
        .iter()
        .flat_map(|v| {
            let b = v.to_bits();
            [f32::from_bits(b << 16), f32::from_bits(b & 0xffff_0000)]
        })
        .collect()
}

fn round_bf16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect()
}

/// The modes each wide test runs in: f32-exact x; x rounded to bf16 on the split kernels
/// (kernels/matvec_split.cu, `Gpu::wide_split`); and on matvec.cu's wide `_x1` kernels.
const MODES: [(bool, bool); 3] = [(false, false), (true, true), (true, false)];

fn set_mode(g: &mut Gpu, (x1, split): (bool, bool)) {
    g.wide_split = split;
    g.split_any_grid = split;
    g.split_rows32 = split;
    g.set_activations(if x1 { Activations::Bf16 } else { Activations::F32 }).unwrap();
}

/// A norm producer as o_proj is one: the residual `y0` uploaded into `y`, then y += W·x with
/// x·γ (f32 or bf16 rows) into `ud` and the partial sums of squares into `ss`.
#[allow(clippy::too_many_arguments)]
fn produce(
    g: &Gpu,
    w: &WeightBuf,
    x: &CudaSlice<f32>,
    y0: &[f32],
    gamma: &CudaSlice<f32>,
    [y, ud, ss]: [&mut CudaSlice<f32>; 3],
    shape: (usize, usize, usize),
    bf16_rows: bool,
) -> Normed {
    g.stream.memcpy_htod(y0, y).unwrap();
    let (eps, acc) = (1e-6, true);
    g.matvec_norm_out(
        w,
        (&x.as_view(), false),
        &mut y.as_view_mut(),
        shape,
        acc,
        (&gamma.as_view(), eps),
        &mut ud.as_view_mut(),
        &mut ss.as_view_mut(),
        bf16_rows,
    )
    .unwrap()
}

#[test]
fn wide_launches_equal_eight_row_launches_bit_for_bit() {
    let mut g = gpu();
    for mode in MODES {
        set_mode(&mut g, mode);
        wide_products(&mut g, mode.0, "bf16");
    }
    set_mode(&mut g, (false, true));
}

/// FP8 weights (Qwen's 128 × 128 blocks, and 16 × 64 ones whose scale rows change inside a
/// tile): the `_w2_fp8` / `_w4_fp8` twins, each group's x split with its own rows' scales.
#[test]
fn wide_fp8_launches_equal_eight_row_launches_bit_for_bit() {
    let mut g = gpu();
    set_mode(&mut g, (false, false));
    for dtype in ["fp8", "fp8b"] {
        wide_products(&mut g, false, dtype);
        wide_mlp(&mut g, false, dtype);
    }
    set_mode(&mut g, (false, true));
}

/// Row r of x scaled by 10^((r mod 9) − 4) (FP8: each row's own power of two before its f16
/// split, so a group's rows must find their own scales), or as drawn for bf16.
fn rows_of_ranges(rng: &mut Rng, m: usize, k: usize, dtype: &str) -> Vec<f32> {
    let x = rng.vec(m * k);
    if dtype == "bf16" {
        return x;
    }
    x.chunks(k).enumerate().flat_map(|(r, row)| row.iter().map(move |v| v * 10f32.powi((r % 9) as i32 - 4))).collect()
}

fn wide_products(g: &mut Gpu, x1: bool, dtype: &str) {
    let split = g.wide_split;
    let mut rng = Rng(71);
    // (out, in): many tiles (matvec_tc_bf16), K split over a block (u4), one layer's k|v (u4b1h);
    // 3 tiles at K split 8 (the split kernels: one tile group of 4, a warp idle, the cluster
    // padded); 13 tiles at K split 4 and 2 (the split kernels' clusters of 2 and 4 groups).
    let shapes: &[(usize, usize)] = if full_size() {
        &[(6144, 4096), (4096, 4096), (1024, 4096), (200, 136), (40, 1024), (200, 512), (200, 256)]
    } else {
        &[(200, 136), (96, 64), (40, 1024), (200, 512), (200, 256)]
    };
    for &(out, k) in shapes {
        if dtype != "bf16" && !k.is_multiple_of(64) {
            continue; // FP8's tensor-core kernels take whole 64-wide chunks of scale blocks
        }
        let (w, wf) = weight_cols(g, &rng.vec(out * k), k, dtype);
        for &m in &ROWS {
            let x = rows_of_ranges(&mut rng, m, k, dtype);
            let xd = up(g, &x);
            let [wide, eight] = both(g, &[m * out], |g, o| {
                g.matvec(&w, &xd.as_view(), &mut o[0].as_view_mut(), (m, k, out), false).unwrap();
            });
            assert!(
                same_bits(&wide[0], &eight[0]),
                "{dtype} {out}x{k}, {m} rows, x1 {x1}, split {split}: wide launches differ"
            );
            let xr = if x1 { round_bf16(&x) } else { x.clone() };
            let want = cpu::matmul::linear(&xr, &wf, m, k, out);
            // Row by row: FP8's rows span eight decades.
            for r in 0..m {
                let e = rel_err(&wide[0][r * out..][..out], &want[r * out..][..out]);
                assert!(e <= 1e-5, "{dtype} {out}x{k}, row {r} of {m}, x1 {x1}, split {split}: rel err {e}");
            }
            // The last row launched alone: the same bits as inside the wide launch.
            let r = m - 1;
            let mut one = poisoned(g, out);
            let xs = xd.slice(r * k..m * k);
            g.matvec(&w, &xs, &mut one.as_view_mut(), (1, k, out), false).unwrap();
            assert!(
                same_bits(&down(g, &one), &wide[0][r * out..]),
                "{dtype} {out}x{k}, row {r} of {m}, x1 {x1}, split {split}: alone differs"
            );
        }
    }
}

#[test]
fn wide_swiglu_and_norm_fold_equal_eight_row_launches() {
    let mut g = gpu();
    for mode in MODES {
        set_mode(&mut g, mode);
        wide_mlp(&mut g, mode.0, "bf16");
    }
    set_mode(&mut g, (false, true));
}

fn wide_mlp(g: &mut Gpu, x1: bool, dtype: &str) {
    let split = g.wide_split;
    let mut rng = Rng(73);
    let (h, k, inter) = match (full_size(), dtype) {
        (true, _) => (4096, 4096, 12288),
        (false, "bf16") => (256, 136, 96),
        // FP8: K a multiple of 64 (whole chunks of scale blocks).
        (false, _) => (256, 128, 96),
    };
    let (wp, _) = weight_cols(g, &rng.vec(h * k), k, dtype);
    let (wgu, _) = weight_cols(g, &rng.vec(2 * inter * h), h, dtype);
    let gamma = up(g, &rng.vec(h).iter().map(|v| 1.0 + 0.5 * v).collect::<Vec<_>>());
    for &m in &ROWS {
        let (x, y0) = (up(g, &rng.vec(m * k)), rng.vec(m * h));
        let parts_max = h.div_ceil(16);
        // Producer (residual add, x·γ, partial Σ y²), then the SwiGLU consumer scaling by 1/rms.
        let lens = [m * h, m * h, m * parts_max, m * 2 * inter, m * inter];
        let [wide, eight] = both(g, &lens, |g, o| {
            let [y, ud, ss, gu, act] = o else { unreachable!("five outputs") };
            let normed = produce(g, &wp, &x, &y0, &gamma, [y, ud, ss], (m, k, h), false);
            assert!(matches!(normed, Normed::Pending { .. }), "the fold must happen: {normed:?}");
            let parts = normed.parts();
            g.matvec_swiglu_normed(
                &wgu,
                &mut ud.as_view_mut(),
                normed,
                &ss.slice(..m * parts),
                &mut gu.as_view_mut(),
                &mut act.as_view_mut(),
                (m, h, inter),
                x1,
            )
            .unwrap();
        });
        let what = ["residual", "x·γ", "partial sums of squares", "gate|up scratch", "SwiGLU output"];
        for (i, what) in what.iter().enumerate() {
            // Entries a kernel never writes (partials past the grid's width) hold the same poison
            // in both runs.
            assert!(
                same_bits(&wide[i], &eight[i]),
                "{dtype}, {m} rows, x1 {x1}, split {split}: {what} differs between wide and 8-row launches"
            );
        }
        // With bf16 activations act holds bf16 rows in its first half (the rest poison).
        let written = if x1 { m * inter / 2 } else { m * inter };
        assert!(wide[4][..written].iter().all(|v| v.is_finite()), "{m} rows: SwiGLU output left unwritten");
        assert!(wide[0].iter().all(|v| v.is_finite()), "{m} rows: residual left unwritten");
    }
}

#[test]
fn bf16_rows_give_the_same_bits_as_f32_rows() {
    let mut g = gpu();
    g.set_activations(Activations::Bf16).unwrap();
    let mut rng = Rng(79);
    let (h, k, inter, qkv) = if full_size() { (4096, 4096, 12288, 6144) } else { (256, 136, 96, 200) };
    let (wo, _) = weight_cols(&g, &rng.vec(h * k), k, "bf16");
    let (wqkv, _) = weight_cols(&g, &rng.vec(qkv * h), h, "bf16");
    let (wgu, _) = weight_cols(&g, &rng.vec(2 * inter * h), h, "bf16");
    let (wd, _) = weight_cols(&g, &rng.vec(h * inter), inter, "bf16");
    let gamma = up(&g, &rng.vec(h).iter().map(|v| 1.0 + 0.5 * v).collect::<Vec<_>>());
    for &m in &[1, 7, 8, 9, 16, 23, 32, 40, 64] {
        let (x, y0) = (up(&g, &rng.vec(m * k)), rng.vec(m * h));
        let parts_max = h.div_ceil(16);
        // Producer (residual, x·γ, partials), then both consumers: q|k|v-like and SwiGLU; then
        // down over the SwiGLU's act (bf16 rows with bf16_rows), a norm producer itself.
        let run = |g: &Gpu, bf16_rows: bool| {
            let lens = [m * h, m * h, m * parts_max, m * qkv, m * 2 * inter, m * inter, m * h, m * h, m * parts_max];
            let mut o: Vec<CudaSlice<f32>> = lens.iter().map(|&n| poisoned(g, n)).collect();
            let [y, ud, ss, q, gu, act, y2, u2, ss2] = &mut o[..] else { unreachable!("nine outputs") };
            let normed = produce(g, &wo, &x, &y0, &gamma, [y, ud, ss], (m, k, h), bf16_rows);
            assert!(
                matches!(normed, Normed::Pending { bf16, .. } if bf16 == bf16_rows),
                "{m} rows: the producer left {normed:?}"
            );
            let ssv = ss.slice(..m * normed.parts());
            g.matvec_normed(&wqkv, &mut ud.as_view_mut(), normed, &ssv, &mut q.as_view_mut(), (m, h, qkv), false)
                .unwrap();
            let act_bf16 = g
                .matvec_swiglu_normed(
                    &wgu,
                    &mut ud.as_view_mut(),
                    normed,
                    &ssv,
                    &mut gu.as_view_mut(),
                    &mut act.as_view_mut(),
                    (m, h, inter),
                    bf16_rows,
                )
                .unwrap();
            assert_eq!(act_bf16, bf16_rows, "{m} rows: act rows");
            g.stream.memcpy_htod(&y0, y2).unwrap();
            g.matvec_norm_out(
                &wd,
                (&act.as_view(), act_bf16),
                &mut y2.as_view_mut(),
                (m, inter, h),
                true,
                (&gamma.as_view(), 1e-6),
                &mut u2.as_view_mut(),
                &mut ss2.as_view_mut(),
                false,
            )
            .unwrap();
            o.iter().map(|v| down(g, v)).collect::<Vec<_>>()
        };
        let (rows, f32s) = (run(&g, true), run(&g, false));
        for (i, what) in [
            (0, "residual"),
            (2, "partial sums of squares"),
            (3, "q|k|v-like output"),
            (6, "down's residual"),
            (7, "down's x·γ"),
            (8, "down's partial sums of squares"),
        ] {
            assert!(same_bits(&rows[i], &f32s[i]), "{m} rows: {what} differs with bf16 rows");
        }
        assert!(rows[6].iter().all(|v| v.is_finite()), "{m} rows: down's output left unwritten");
        let act = widen_bf16_rows(&rows[5][..m * inter / 2]);
        assert!(same_bits(&act, &round_bf16(&f32s[5])), "{m} rows: the bf16 act rows are not act rounded");
        assert!(rows[3].iter().all(|v| v.is_finite()), "{m} rows: consumer output left unwritten");
        // The stored rows: each f32 row's x·γ rounded to bf16, in u's first half.
        let stored = widen_bf16_rows(&rows[1][..m * h / 2]);
        assert!(same_bits(&stored, &round_bf16(&f32s[1])), "{m} rows: the bf16 rows are not x·γ rounded");
    }
    g.set_activations(Activations::F32).unwrap();
}
