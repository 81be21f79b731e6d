//! The argmax kernels: the split argmax over NaN, ties and few rows, ties to the lowest index,
//! and the argmax that gathers the winner's table row (the Markov chain's step).

use super::*;

#[test]
fn split_argmax_ties_nan_and_small_rows() {
    let g = gpu();
    let mut sc = scratch(&g, 4, 32);
    for vocab in [1usize, 5000, 151936] {
        let mut rows = vec![0f32; 3 * vocab];
        if vocab > 1 {
            rows[vocab - 1] = 2.0; // row 0: the last index
            rows[vocab + 10] = f32::NAN;
            rows[vocab + vocab / 2] = 3.0; // row 1: a tie, the lower index wins
            rows[vocab + vocab - 2] = 3.0;
        }
        let d = up(&g, &rows);
        let mut out = g.stream.clone_htod(&[u32::MAX; 3]).unwrap();
        g.argmax_split(&d.as_view(), vocab, vocab, 3, &mut out.as_view_mut(), &mut sc).unwrap();
        let want: Vec<u32> = cpu::argmax::argmax_rows(&rows, vocab).iter().map(|&i| i as u32).collect();
        assert_eq!(g.stream.clone_dtoh(&out).unwrap(), want, "vocab {vocab}");
    }
}

#[test]
fn argmax_gather_returns_the_token_and_its_table_row() {
    // One Markov step: the argmax of a logits row, then W1[token] in the same launch, for every
    // table dtype; the table row must be exact (a copy) and the token the CPU argmax.
    let g = gpu();
    let mut rng = Rng(13);
    let mut sc = scratch(&g, 4, 32);
    for (vocab, dim) in [(5000usize, 64usize), (151936, 256)].into_iter().filter(|s| full_size() || s.0 < 10000) {
        let logits = rng.vec(vocab);
        let want = cpu::argmax::argmax_rows(&logits, vocab)[0];
        let d = up(&g, &logits);
        for dtype in ["bf16", "f16", "f32"] {
            let (t, tf) = weight(&g, &rng.vec(vocab * dim), dtype);
            let mut out = g.stream.clone_htod(&[u32::MAX]).unwrap();
            let mut row = poisoned(&g, dim);
            g.argmax_gather(
                &d.as_view(),
                vocab,
                &mut out.as_view_mut(),
                &mut sc,
                ((&t).into(), dim),
                &mut row.as_view_mut(),
            )
            .unwrap();
            assert_eq!(g.stream.clone_dtoh(&out).unwrap(), vec![want as u32], "{dtype} vocab {vocab}");
            assert_eq!(down(&g, &row), tf[want * dim..][..dim].to_vec(), "{dtype} vocab {vocab}");
        }
    }
}

#[test]
fn argmax_ties_take_the_lowest_index() {
    let g = gpu();
    let mut row = vec![0f32; 5000];
    row[4000] = 3.0;
    row[1234] = 3.0;
    row[10] = f32::NAN;
    let d = up(&g, &row);
    let mut out = g.stream.clone_htod(&[u32::MAX]).unwrap();
    g.argmax(&d.as_view(), 5000, 5000, 1, &mut out.as_view_mut()).unwrap();
    assert_eq!(g.stream.clone_dtoh(&out).unwrap(), vec![1234]);
}
