//! The small-M matvec family against the f32 reference (1e-5 relative): every weight dtype at
//! small and Qwen3-8B shapes; the tile-looping and held-K kernels against the one-tile,
//! double-buffered one; lm_head's shape with its argmax; the tensor-core kernels' rows (each row
//! the same bits alone and among others) and their SwiGLU epilogue.

use super::*;

#[test]
fn matvec_all_dtypes_and_qwen3_8b_shapes() {
    let g = gpu();
    let mut rng = Rng(1);
    let shapes = [
        (1, 64, 32),
        (7, 96, 40),
        (16, 128, 50),
        (20, 64, 24),
        (5, 72, 33),
        (7, 4096, 1024),
        (7, 4096, 4096),
        (1, 4096, 6144),
        (1, 4096, 12288),
        (8, 12288, 4096),
        (16, 4096, 24576),
    ];
    for dtype in ["bf16", "f16", "f32", "fp8", "fp8b", "fp8s"] {
        for &(m, d_in, d_out) in shapes.iter().filter(|s| full_size() || s.1 * s.2 <= 1 << 16) {
            let x = rng.vec(m * d_in);
            let (w, wf) = weight_cols(&g, &rng.vec(d_out * d_in), d_in, dtype);
            let want = cpu::matmul::linear(&x, &wf, m, d_in, d_out);
            let xd = up(&g, &x);
            let mut y = poisoned(&g, m * d_out);
            let ran = matvec_profiled(&g, &w, &xd, &mut y, (m, d_in, d_out), false);
            // FP8 weights take their own kernels: the tensor-core twins where the shape allows,
            // each after x's split into f16 parts (kernels/fp8.cu) — or, for one row, with x
            // split inside the matvec's blocks (`_n1x_fp8`; these shapes fit any GPU's shared
            // memory).
            if dtype.starts_with("fp8") {
                let tc = takes_tc(dtype, d_in);
                let in_block = tc && m == 1 && g.fp8_split_in_block;
                // The split: split_x_f16x2_row, or split_x_f16x2 for rows one block does not hold.
                let split = ran.iter().filter(|k| k.starts_with("split_x_f16x2")).count();
                let mv: Vec<&String> = ran.iter().filter(|k| !k.starts_with("split_x_f16x2")).collect();
                assert!(
                    mv.iter().all(|k| k.ends_with("_fp8") && k.starts_with("matvec_tc") == tc)
                        && (split > 0) == (tc && !in_block)
                        && (!in_block || mv.iter().all(|k| k.ends_with("_n1x_fp8"))),
                    "{dtype} {m}x{d_in}->{d_out}: ran {ran:?}"
                );
            }
            let e = rel_err(&down(&g, &y), &want);
            assert!(e <= 1e-5, "matvec {dtype} {m}x{d_in}->{d_out}: rel err {e}");
            // Accumulate mode adds onto what is there.
            let base = rng.vec(m * d_out);
            let mut y = up(&g, &base);
            g.matvec(&w, &xd.as_view(), &mut y.as_view_mut(), (m, d_in, d_out), true).unwrap();
            let want_acc: Vec<f32> = want.iter().zip(&base).map(|(a, b)| a + b).collect();
            assert!(rel_err(&down(&g, &y), &want_acc) <= 1e-5, "matvec accumulate {dtype}");
        }
    }
}

/// The tile-looping tensor-core kernel (`matvec_tc_loop_bf16`, taken by shapes of many short
/// tiles such as Markov W2) against the CPU reference at 1e-5 and against the one-tile kernel at
/// K split 1, whose sums it must reproduce bit for bit; a profile shows which kernel ran. The
/// first shape (more tiles than one wave's warps, not a multiple of 16 rows) also runs under the
/// sanitizers.
#[test]
fn tile_looping_matvec_matches_the_one_tile_kernel() {
    let g = gpu();
    let mut rng = Rng(41);
    let shapes = [(3, 64, 50_993), (1, 256, 151_936), (7, 256, 151_936), (8, 1024, 60_000)];
    for &(m, d_in, d_out) in shapes.iter().filter(|s| full_size() || s.1 <= 64) {
        let x = rng.vec(m * d_in);
        let (w, wf) = weight(&g, &rng.vec(d_out * d_in), "bf16");
        let want = cpu::matmul::linear(&x, &wf, m, d_in, d_out);
        let xd = up(&g, &x);
        for accumulate in [false, true] {
            let base = rng.vec(m * d_out);
            let start = |g: &Gpu| if accumulate { up(g, &base) } else { poisoned(g, m * d_out) };
            let (mut y, mut y1) = (start(&g), start(&g));
            let ran = matvec_profiled(&g, &w, &xd, &mut y, (m, d_in, d_out), accumulate);
            assert_eq!(ran, ["matvec_tc_loop_bf16"], "{m}x{d_in}->{d_out}: kernels");
            let shape = (m, d_in, d_out);
            if accumulate {
                // The variant entry writes y (no accumulate): add the base on the host, as the
                // kernel adds its sum to y, one rounding.
                let mut t = poisoned(&g, m * d_out);
                g.matvec_tc_variant("matvec_tc_bf16@1", &w, &xd.as_view(), &mut t.as_view_mut(), shape).unwrap();
                let sum: Vec<f32> = down(&g, &t).iter().zip(&base).map(|(a, b)| b + a).collect();
                y1 = up(&g, &sum);
            } else {
                g.matvec_tc_variant("matvec_tc_bf16@1", &w, &xd.as_view(), &mut y1.as_view_mut(), shape).unwrap();
            }
            let (got, one) = (down(&g, &y), down(&g, &y1));
            let want_y: Vec<f32> =
                if accumulate { want.iter().zip(&base).map(|(a, b)| b + a).collect() } else { want.clone() };
            let e = rel_err(&got, &want_y);
            assert!(e <= 1e-5, "tile-looping matvec {m}x{d_in}->{d_out} (accumulate {accumulate}): rel err {e}");
            assert!(
                got == one,
                "tile-looping matvec {m}x{d_in}->{d_out} (accumulate {accumulate}): not the one-tile kernel's bits"
            );
        }
    }
}

/// The few-tile kernel that holds a warp's whole K range in registers (`matvec_tc_u4b1h_bf16`,
/// taken by one layer's k or v: 64 tiles of K 4096) against the CPU reference at 1e-5 and against
/// the double-buffered one-block kernel at the same K split, whose sums it must reproduce bit for
/// bit; a profile shows which kernel ran. K 2056 ends in a part chunk and a part step; the small
/// shapes also run under the sanitizers.
#[test]
fn held_k_matvec_matches_the_double_buffered_kernel() {
    let g = gpu();
    let mut rng = Rng(43);
    let shapes = [(3, 1024, 40), (8, 2056, 24), (7, 4096, 1024), (1, 4096, 1024)];
    for &(m, d_in, d_out) in shapes.iter().filter(|s| full_size() || s.1 * s.2 <= 1 << 16) {
        let x = rng.vec(m * d_in);
        let (w, wf) = weight(&g, &rng.vec(d_out * d_in), "bf16");
        let want = cpu::matmul::linear(&x, &wf, m, d_in, d_out);
        let xd = up(&g, &x);
        let mut y = poisoned(&g, m * d_out);
        let ran = matvec_profiled(&g, &w, &xd, &mut y, (m, d_in, d_out), false);
        assert_eq!(ran, ["matvec_tc_u4b1h_bf16"], "{m}x{d_in}->{d_out}: kernels");
        let mut y1 = poisoned(&g, m * d_out);
        g.matvec_tc_variant("matvec_tc_u4b1_bf16@8", &w, &xd.as_view(), &mut y1.as_view_mut(), (m, d_in, d_out))
            .unwrap();
        let (got, db) = (down(&g, &y), down(&g, &y1));
        let e = rel_err(&got, &want);
        assert!(e <= 1e-5, "held-K matvec {m}x{d_in}->{d_out}: rel err {e}");
        assert!(got == db, "held-K matvec {m}x{d_in}->{d_out}: not the double-buffered kernel's bits");
    }
    // A K range longer than the registers hold is refused, not truncated.
    let (w, _) = weight(&g, &rng.vec(16 * 8192), "bf16");
    let xd = up(&g, &rng.vec(8192));
    let mut y = poisoned(&g, 16);
    let err = g.matvec_tc_variant("matvec_tc_u4b1h_bf16@8", &w, &xd.as_view(), &mut y.as_view_mut(), (1, 8192, 16));
    assert!(err.is_err(), "K 8192 at split 8 must not run on the held-K kernel");
}

#[test]
fn lm_head_shape_matvec_and_argmax() {
    if !full_size() {
        return;
    }
    let g = gpu();
    let mut rng = Rng(2);
    let (m, d_in, vocab) = (8, 4096, 151936);
    let x = rng.vec(m * d_in);
    let (w, wf) = weight(&g, &rng.vec(vocab * d_in), "bf16");
    let want = cpu::matmul::linear(&x, &wf, m, d_in, vocab);
    let xd = up(&g, &x);
    let mut y = poisoned(&g, m * vocab);
    g.matvec(&w, &xd.as_view(), &mut y.as_view_mut(), (m, d_in, vocab), false).unwrap();
    let got = down(&g, &y);
    assert!(rel_err(&got, &want) <= 1e-5);
    let want_ids: Vec<u32> = cpu::argmax::argmax_rows(&got, vocab).iter().map(|&i| i as u32).collect();
    let mut ids = g.stream.clone_htod(&vec![u32::MAX; m]).unwrap();
    g.argmax(&y.as_view(), vocab, vocab, m, &mut ids.as_view_mut()).unwrap();
    assert_eq!(g.stream.clone_dtoh(&ids).unwrap(), want_ids);
    // The split argmax, twice: its tickets must come back to zero for the next launch.
    let mut sc = scratch(&g, 32, 128);
    for _ in 0..2 {
        let mut ids = g.stream.clone_htod(&vec![u32::MAX; m]).unwrap();
        g.argmax_split(&y.as_view(), vocab, vocab, m, &mut ids.as_view_mut(), &mut sc).unwrap();
        assert_eq!(g.stream.clone_dtoh(&ids).unwrap(), want_ids);
    }
}

#[test]
fn tensor_core_matvec_rows_and_swiglu_epilogue() {
    let g = gpu();
    let mut rng = Rng(11);
    // matvec_rows: a block of rows of a stacked matrix (the k|v rows of q|k|v).
    for (dtype, &(m, d_in, row0, d_out)) in ["bf16", "fp8", "fp8b", "fp8s"]
        .iter()
        .flat_map(|d| [(3usize, 64usize, 48usize, 32usize), (7, 4096, 4096, 2048)].iter().map(move |s| (*d, s)))
    {
        if !full_size() && d_in > 1000 {
            continue;
        }
        let total = row0 + d_out;
        let (w, wf) = weight_cols(&g, &rng.vec(total * d_in), d_in, dtype);
        let x = rng.vec(m * d_in);
        let want = cpu::matmul::linear(&x, &wf[row0 * d_in..], m, d_in, d_out);
        let xd = up(&g, &x);
        let mut y = poisoned(&g, m * d_out);
        g.matvec_rows(&w, row0, &xd.as_view(), &mut y.as_view_mut(), (m, d_in, d_out), false).unwrap();
        let e = rel_err(&down(&g, &y), &want);
        assert!(e <= 1e-5, "matvec_rows {dtype} {m}x{d_in} rows {row0}..: {e}");
    }
    // gate|up with interleaved rows and the SwiGLU as epilogue, on bf16 (tensor cores) and
    // f32 (general matvec + pairwise SwiGLU).
    for dtype in ["bf16", "f32", "fp8", "fp8b", "fp8s"] {
        for &(m, d_in, inter) in &[(1usize, 48usize, 24usize), (7, 136, 40), (8, 4096, 12288), (1, 4096, 12288)] {
            if !full_size() && inter > 1000 {
                continue;
            }
            let x = rng.vec(m * d_in);
            let (gate, upw) = (rng.vec(inter * d_in), rng.vec(inter * d_in));
            let mut inter_rows = Vec::with_capacity(2 * inter * d_in);
            for r in 0..inter {
                inter_rows.extend_from_slice(&gate[r * d_in..][..d_in]);
                inter_rows.extend_from_slice(&upw[r * d_in..][..d_in]);
            }
            let (w, wf) = weight_cols(&g, &inter_rows, d_in, dtype);
            let both = cpu::matmul::linear(&x, &wf, m, d_in, 2 * inter);
            let mut want = Vec::new();
            for r in 0..m {
                let row = &both[r * 2 * inter..][..2 * inter];
                let mut gt: Vec<f32> = row.iter().step_by(2).copied().collect();
                let ut: Vec<f32> = row.iter().skip(1).step_by(2).copied().collect();
                cpu::activation::swiglu_inplace(&mut gt, &ut);
                want.extend(gt);
            }
            let xd = up(&g, &x);
            let mut gu = poisoned(&g, m * 2 * inter);
            let mut act = poisoned(&g, m * inter);
            g.matvec_swiglu(&w, &xd.as_view(), &mut gu.as_view_mut(), &mut act.as_view_mut(), (m, d_in, inter))
                .unwrap();
            let e = rel_err(&down(&g, &act), &want);
            assert!(e <= 1e-5, "matvec_swiglu {dtype} {m}x{d_in}->{inter}: {e}");
        }
    }
}

/// `g.matvec` of `w` on `x` into `y`, with the names of the kernels it launched.
fn matvec_profiled(
    g: &Gpu,
    w: &WeightBuf,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    shape: (usize, usize, usize),
    accumulate: bool,
) -> Vec<String> {
    kernels_run(g, |g| g.matvec(w, &x.as_view(), &mut y.as_view_mut(), shape, accumulate).unwrap())
}
