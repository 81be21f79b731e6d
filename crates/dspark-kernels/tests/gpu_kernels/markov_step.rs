//! One step of the draft's Markov chain fused into the W2 product (`Gpu::matvec_argmax`,
//! `matvec_tc_argmax_bf16`, or `matvec_tc_loop_argmax_bf16` for many short tiles) against the CPU
//! reference and against the unfused launches
//! (matvec, then argmax_gather / argmax_split). The logits must match the reference at 1e-5 and
//! the unfused product bit for bit (the same main loop); the token must be the argmax of the
//! logits the device wrote (highest value, lowest index on ties); the gathered row must be the
//! exact table row. Token, row and tickets are poisoned or reused across launches, so an
//! unwritten output or a ticket left non-zero fails.

use super::*;
use dspark_kernels::cuda::host_table::{HostTable, TableRef};

#[test]
fn fused_markov_step_matches_the_unfused_launches() {
    let g = gpu();
    let mut rng = Rng(31);
    let mut sc = scratch(&g, 4, 32);
    // (vocab, rank): a small vocabulary, one not a multiple of 16, and two that take the
    // tile-looping kernel (more tiles than one wave's warps): one small enough for the
    // sanitizers, and DSpark-8B's W2.
    let shapes = [(1000usize, 64usize), (5003, 256), (51_000, 64), (151_936, 256)];
    for (vocab, r) in shapes.into_iter().filter(|s| full_size() || s.0 * s.1 < 4_000_000) {
        // Rows a < b of W2 equal and their base logits far above the rest: an exact tie at the
        // top, which the lower index must win.
        let (a, b) = (vocab / 3, vocab / 2);
        let mut w2v = rng.vec(vocab * r);
        w2v.copy_within(a * r..(a + 1) * r, b * r);
        let (w2, w2f) = weight(&g, &w2v, "bf16");
        let (w1, w1f) = weight(&g, &rng.vec(vocab * r), "bf16");
        let x = rng.vec(r);
        let mut base = rng.vec(vocab);
        base[a] = 1000.0;
        base[b] = 1000.0;
        let xd = up(&g, &x);
        let want_y: Vec<f32> =
            cpu::matmul::linear(&x, &w2f, 1, r, vocab).iter().zip(&base).map(|(p, b)| p + b).collect();
        // W1 also as a mapped host table (`--embeddings host`), the same bytes.
        let WeightBuf::Bf16(w1_raw) = &w1 else { panic!("a bf16 table") };
        let w1_bytes: Vec<u8> = g.stream.clone_dtoh(w1_raw).unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
        let w1_host = HostTable::from_bytes(&g.ctx, "bf16", &w1_bytes).unwrap();
        // Twice with the gather (the second run finds the ticket reset), from the host table,
        // and once without.
        for (gather, on_host) in [(true, false), (true, false), (true, true), (false, false)] {
            let mut y = up(&g, &base);
            let mut tok = g.stream.clone_htod(&[u32::MAX]).unwrap();
            let mut row = poisoned(&g, r);
            let mut rowv = row.as_view_mut();
            let table: TableRef = if on_host { (&w1_host).into() } else { (&w1).into() };
            let gat = if gather { Some(((table, r), &mut rowv)) } else { None };
            g.matvec_argmax(
                &w2,
                &xd.as_view(),
                &mut y.as_view_mut(),
                (r, vocab),
                true,
                &mut tok.as_view_mut(),
                &mut sc,
                gat,
            )
            .unwrap();
            let (yh, t) = (down(&g, &y), g.stream.clone_dtoh(&tok).unwrap()[0] as usize);
            let e = rel_err(&yh, &want_y);
            assert!(e <= 1e-5, "vocab {vocab}: logits {e}");
            assert_eq!(t, cpu::argmax::argmax_rows(&yh, vocab)[0], "vocab {vocab}: token");
            assert_eq!(yh[a], yh[b], "vocab {vocab}: equal rows gave unequal logits");
            assert_eq!(t, a, "vocab {vocab}: the tie went to {t}");
            if gather {
                assert_eq!(down(&g, &row), w1f[t * r..][..r].to_vec(), "vocab {vocab}: gathered row");
            } else {
                assert!(down(&g, &row).iter().all(|v| v.is_nan()), "vocab {vocab}: a row gathered without a table");
            }
            // The unfused launches on the same inputs.
            let mut y2 = up(&g, &base);
            let mut tok2 = g.stream.clone_htod(&[u32::MAX]).unwrap();
            g.matvec(&w2, &xd.as_view(), &mut y2.as_view_mut(), (1, r, vocab), true).unwrap();
            g.argmax_split(&y2.as_view(), vocab, vocab, 1, &mut tok2.as_view_mut(), &mut sc).unwrap();
            assert_eq!(down(&g, &y2), yh, "vocab {vocab}: fused and unfused logits differ");
            assert_eq!(g.stream.clone_dtoh(&tok2).unwrap()[0] as usize, t, "vocab {vocab}: tokens differ");
        }
    }
}

#[test]
fn markov_step_falls_back_for_other_dtypes() {
    // An f32 W2 (no tensor-core path) and an f16 table (no fused gather) take matvec +
    // argmax_gather: same contract.
    let g = gpu();
    let mut rng = Rng(32);
    let mut sc = scratch(&g, 4, 32);
    let (vocab, r) = (3000usize, 64usize);
    for (w2_dtype, w1_dtype) in [("f32", "bf16"), ("bf16", "f16")] {
        let (w2, w2f) = weight(&g, &rng.vec(vocab * r), w2_dtype);
        let (w1, w1f) = weight(&g, &rng.vec(vocab * r), w1_dtype);
        let x = rng.vec(r);
        let want_y = cpu::matmul::linear(&x, &w2f, 1, r, vocab);
        let mut y = poisoned(&g, vocab);
        let mut tok = g.stream.clone_htod(&[u32::MAX]).unwrap();
        let mut row = poisoned(&g, r);
        let mut rowv = row.as_view_mut();
        let xd = up(&g, &x);
        g.matvec_argmax(
            &w2,
            &xd.as_view(),
            &mut y.as_view_mut(),
            (r, vocab),
            false,
            &mut tok.as_view_mut(),
            &mut sc,
            Some((((&w1).into(), r), &mut rowv)),
        )
        .unwrap();
        let yh = down(&g, &y);
        assert!(rel_err(&yh, &want_y) <= 1e-5, "{w2_dtype}/{w1_dtype}: logits");
        let t = g.stream.clone_dtoh(&tok).unwrap()[0] as usize;
        assert_eq!(t, cpu::argmax::argmax_rows(&yh, vocab)[0], "{w2_dtype}/{w1_dtype}: token");
        assert_eq!(down(&g, &row), w1f[t * r..][..r].to_vec(), "{w2_dtype}/{w1_dtype}: gathered row");
    }
}
