//! The RMSNorm folded into the matvecs around it (`cuda::norm_fold`) against the unfused path:
//! `y = y0 + W_p x` (the residual add), `u = rmsnorm(y) · γ`, then the consumer `W_c u` or the
//! SwiGLU of an interleaved gate|up — every pairing of a tensor-core (bf16) and a general (f32)
//! producer and consumer, with the partials and `u` poisoned before the producer runs.
//! Tolerance 1e-5 as for every f32 kernel here.

use super::*;
use dspark_kernels::cuda::norm_fold::Normed;

const EPS: f32 = 1e-6;

/// (rows, producer in, hidden, consumer out): one row, a draft block, a verify, a prefill
/// chunk of more than 8 rows (two launches), and Qwen3-8B's o_proj → q|k|v.
const SHAPES: [(usize, usize, usize, usize); 5] =
    [(1, 64, 256, 96), (7, 136, 512, 200), (8, 96, 128, 64), (11, 64, 128, 80), (7, 4096, 4096, 6144)];

struct Case {
    u: Vec<f32>,
    ud: CudaSlice<f32>,
    ss: CudaSlice<f32>,
    normed: Normed,
}

/// Runs the producer on fresh inputs and checks the residual it wrote.
fn produce(g: &Gpu, rng: &mut Rng, dtype: &str, (m, k, h): (usize, usize, usize)) -> Case {
    let (wp, wpf) = weight_cols(g, &rng.vec(h * k), k, dtype);
    let x = rng.vec(m * k);
    let y0 = rng.vec(m * h);
    let gamma: Vec<f32> = rng.vec(h).iter().map(|v| 1.0 + 0.5 * v).collect();
    let mut y = cpu::matmul::linear(&x, &wpf, m, k, h);
    y.iter_mut().zip(&y0).for_each(|(a, b)| *a += b);
    let u: Vec<f32> = y.chunks(h).flat_map(|row| cpu::rmsnorm::rmsnorm(row, &gamma, EPS)).collect();

    let (xd, gd) = (up(g, &x), up(g, &gamma));
    let mut yd = up(g, &y0);
    let mut ud = poisoned(g, m * h);
    let mut ss = poisoned(g, m * h.div_ceil(16));
    let normed = g
        .matvec_norm_out(
            &wp,
            (&xd.as_view(), false),
            &mut yd.as_view_mut(),
            (m, k, h),
            true,
            (&gd.as_view(), EPS),
            &mut ud.as_view_mut(),
            &mut ss.as_view_mut(),
            false,
        )
        .unwrap();
    // The fold must actually happen on the tensor-core path, and only there.
    assert_eq!(matches!(normed, Normed::Pending { .. }), takes_tc(dtype, k), "{dtype} producer left {normed:?}");
    let e = rel_err(&down(g, &yd), &y);
    assert!(e <= 1e-5, "norm producer {dtype} {m}x{k}->{h}: residual rel err {e}");
    Case { u, ud, ss, normed }
}

#[test]
fn folded_rmsnorm_matches_norm_then_matvec() {
    let g = gpu();
    let mut rng = Rng(23);
    for &(m, k, h, out) in &SHAPES {
        if !full_size() && k > 1000 {
            continue;
        }
        for (pd, cd) in [
            ("bf16", "bf16"),
            ("bf16", "f32"),
            ("f32", "bf16"),
            ("f32", "f32"),
            ("fp8", "fp8"),
            ("fp8", "f32"),
            ("f32", "fp8"),
            ("bf16", "fp8b"),
        ] {
            let mut c = produce(&g, &mut rng, pd, (m, k, h));
            let (wc, wcf) = weight_cols(&g, &rng.vec(out * h), h, cd);
            let want = cpu::matmul::linear(&c.u, &wcf, m, h, out);
            let parts = c.normed.parts();
            let mut z = poisoned(&g, m * out);
            g.matvec_normed(
                &wc,
                &mut c.ud.as_view_mut(),
                c.normed,
                &c.ss.slice(..m * parts),
                &mut z.as_view_mut(),
                (m, h, out),
                false,
            )
            .unwrap();
            let got = down(&g, &z);
            let e = rel_err(&got, &want);
            assert!(e <= 1e-5, "folded norm {pd}→{cd} {m}x{k}->{h}->{out}: rel err {e}");

            // Row 0 alone gives the same bits as row 0 of the batch: the fold keeps the matvec
            // independent of the number of rows (decode vs verify, the lossless invariant).
            if (cd, pd) == ("bf16", "bf16") || (cd, pd) == ("fp8", "fp8") {
                let mut z1 = poisoned(&g, out);
                let mut u1 = c.ud.slice_mut(..h);
                g.matvec_normed(
                    &wc,
                    &mut u1,
                    c.normed,
                    &c.ss.slice(..parts),
                    &mut z1.as_view_mut(),
                    (1, h, out),
                    false,
                )
                .unwrap();
                assert_eq!(down(&g, &z1), got[..out], "folded norm: row 0 alone differs from row 0 of {m}");
            }
        }
    }
}

#[test]
fn folded_rmsnorm_into_swiglu() {
    let g = gpu();
    let mut rng = Rng(29);
    for &(m, k, h, inter) in &[(1usize, 64usize, 128usize, 40usize), (8, 64, 256, 96), (7, 4096, 4096, 12288)] {
        if !full_size() && k > 1000 {
            continue;
        }
        for (pd, cd) in [("bf16", "bf16"), ("bf16", "f32"), ("fp8", "fp8"), ("bf16", "fp8b")] {
            let mut c = produce(&g, &mut rng, pd, (m, k, h));
            let (wgu, wf) = weight_cols(&g, &rng.vec(2 * inter * h), h, cd);
            let both = cpu::matmul::linear(&c.u, &wf, m, h, 2 * inter);
            let mut want = Vec::new();
            for row in both.chunks(2 * inter) {
                let mut gt: Vec<f32> = row.iter().step_by(2).copied().collect();
                let ut: Vec<f32> = row.iter().skip(1).step_by(2).copied().collect();
                cpu::activation::swiglu_inplace(&mut gt, &ut);
                want.extend(gt);
            }
            let parts = c.normed.parts();
            let mut gu = poisoned(&g, m * 2 * inter);
            let mut act = poisoned(&g, m * inter);
            g.matvec_swiglu_normed(
                &wgu,
                &mut c.ud.as_view_mut(),
                c.normed,
                &c.ss.slice(..m * parts),
                &mut gu.as_view_mut(),
                &mut act.as_view_mut(),
                (m, h, inter),
                false,
            )
            .unwrap();
            let e = rel_err(&down(&g, &act), &want);
            assert!(e <= 1e-5, "folded norm → swiglu {pd}→{cd} {m}x{h}->{inter}: rel err {e}");
        }
    }
}
