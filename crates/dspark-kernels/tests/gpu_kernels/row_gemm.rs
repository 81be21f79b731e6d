//! The bf16 mode's row GEMMs (`row_gemm.rs`): each shape planned once, then every row of a
//! launch of m rows the same bits as the same row in a launch of 64 — at every m from 1 to 64
//! and at every offset tried — and the products held to an f32 reference fed the same bf16 x and
//! W at 1e-5 (both sum exact bf16 products in f32; only the order differs). Outputs are
//! poisoned first; the accumulate form adds onto a random residual.

use super::*;
use dspark_kernels::cuda::row_gemm::PLAN_ROWS;
use dspark_kernels::Activations;

fn bf16_bits(v: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect();
    let vals = bits.iter().map(|b| bf16::from_bits(*b).to_f32()).collect();
    (bits, vals)
}

fn reference(x: &[f32], w: &[f32], y0: Option<&[f32]>, (m, k, n): (usize, usize, usize)) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        for o in 0..n {
            let dot: f64 = (0..k).map(|i| x[r * k + i] as f64 * w[o * k + i] as f64).sum();
            y[r * n + o] = dot as f32 + y0.map_or(0.0, |y0| y0[r * n + o]);
        }
    }
    y
}

#[test]
fn row_gemm_rows_are_the_same_bits_at_every_row_count() {
    let mut g = gpu();
    g.set_activations(Activations::Bf16).unwrap();
    let Some(rg) = g.row_gemm.clone() else { panic!("the GPU tier needs cuBLASLt for --activations bf16") };
    let mut rng = Rng(0x2026_1206);
    // A small shape, then Qwen3-8B's o_proj and down_proj.
    let mut shapes = vec![(96usize, 256usize)];
    if full_size() {
        shapes.extend([(4096, 4096), (4096, 12288)]);
    }
    for (n, k) in shapes {
        let (w, wv) = weight(&g, &rng.vec(n * k).iter().map(|v| v * 0.05).collect::<Vec<_>>(), "bf16");
        rg.plan(&g, &w, k, n).unwrap();
        assert!(rg.planned(n, k));
        let (xb, xv) = bf16_bits(&rng.vec(PLAN_ROWS * k));
        let x = g.stream.clone_htod(&xb).unwrap();
        let y0 = rng.vec(PLAN_ROWS * n);
        for accumulate in [false, true] {
            let mut all = if accumulate { up(&g, &y0) } else { poisoned(&g, PLAN_ROWS * n) };
            g.row_gemm_bf16(&rg, &w, &x.slice(..), &mut all.slice_mut(..), (PLAN_ROWS, k, n), accumulate).unwrap();
            let all = down(&g, &all);
            let want = reference(&xv, &wv, accumulate.then_some(&y0[..]), (PLAN_ROWS, k, n));
            let err = rel_err(&all, &want);
            assert!(err < 1e-5, "{n} × {k}, accumulate {accumulate}: {err:e} against the reference");
            // Every m at a random offset, and m = 1 at every fourth row.
            let runs: Vec<(usize, usize)> = (1..=PLAN_ROWS)
                .map(|m| (m, rng.below(PLAN_ROWS - m + 1)))
                .chain((0..PLAN_ROWS).step_by(4).map(|r| (1, r)))
                .collect();
            for (m, off) in runs {
                let mut y = if accumulate { up(&g, &y0[off * n..(off + m) * n]) } else { poisoned(&g, m * n) };
                g.row_gemm_bf16(&rg, &w, &x.slice(off * k..(off + m) * k), &mut y.slice_mut(..), (m, k, n), accumulate)
                    .unwrap();
                let got = down(&g, &y);
                let same = got.iter().zip(&all[off * n..(off + m) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{n} × {k}, accumulate {accumulate}: rows {off}..{} alone differ from the 64-row launch",
                    off + m
                );
            }
        }
    }
}

#[test]
fn row_gemm_refuses_an_unplanned_shape_and_other_dtypes() {
    let mut g = gpu();
    g.set_activations(Activations::Bf16).unwrap();
    let rg = g.row_gemm.clone().expect("cuBLASLt");
    let mut rng = Rng(7);
    let (w, _) = weight(&g, &rng.vec(32 * 64), "bf16");
    let x = g.stream.clone_htod(&vec![0u16; 64]).unwrap();
    let mut y = poisoned(&g, 32);
    let err = g.row_gemm_bf16(&rg, &w, &x.slice(..), &mut y.slice_mut(..), (1, 64, 32), false).unwrap_err();
    assert!(err.to_string().contains("not planned"), "{err}");
    let (w32, _) = weight(&g, &rng.vec(32 * 64), "f32");
    assert!(rg.plan(&g, &w32, 64, 32).is_err());
}

/// `rmsnorm_to_bf16`, which feeds every row GEMM of a layer: each value the f32 RMSNorm
/// (`rmsnorm_f32`, same sum) rounded to bf16, on the float4 path (Qwen3-8B's 4,096) and on the
/// strided one (a row of 4,100, and an unaligned start), every output written.
#[test]
fn rmsnorm_to_bf16_is_the_f32_norm_rounded() {
    use dspark_kernels::cuda::gemm::Half;
    let g = gpu();
    let mut rng = Rng(31);
    for (rows, dim, skip) in [(64usize, 4096usize, 0usize), (5, 4100, 0), (3, 256, 1)] {
        let x = up(&g, &rng.vec(skip + rows * dim));
        let w = up(&g, &rng.vec(dim));
        let xv = x.slice(skip..skip + rows * dim);
        let mut f = poisoned(&g, rows * dim);
        g.rmsnorm(&xv, &w.slice(..), 1e-6, rows, &mut f.slice_mut(..)).unwrap();
        let want: Vec<u16> = down(&g, &f).iter().map(|v| bf16::from_f32(*v).to_bits()).collect();
        let mut out = g.stream.clone_htod(&vec![0x7fc1u16; rows * dim]).unwrap();
        g.rmsnorm_to(Half::Bf16, &xv, &w.slice(..), 1e-6, rows, &mut out.slice_mut(..)).unwrap();
        let got = g.stream.clone_dtoh(&out).unwrap();
        assert!(got == want, "{rows} rows of {dim} (start {skip}): not the f32 norm rounded");
    }
}
