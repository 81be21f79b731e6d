//! The attention kernels and the fused q|k|v norm + RoPE + cache append, for both KV cache
//! element types (`cuda::kv`): f32 caches against the f32 CPU reference at 1e-5; bf16 caches
//! against the same reference fed the bf16-rounded keys and values (which the kernels widen
//! exactly, so the bound is the same 1e-5). The append with a bf16 cache rounds once what the f32
//! chain computes, so its keys may sit one bf16 step from the reference's rounded keys where the
//! two f32 values straddle a rounding boundary: ≤ 2⁻⁸ of the largest key, beside the 2e-5 of the
//! f32 chain.

use super::*;
use dspark_kernels::cpu::round_bf16;
use dspark_kernels::cuda::kv::{KvDtype, KvView, KvViewMut};
use dspark_kernels::Activations;

/// A cache as the device holds it: f32, or bf16 bits (NaN stays NaN: the poison rows).
pub(super) enum Cache {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
}

impl Cache {
    pub(super) fn up(g: &Gpu, v: &[f32], kv: KvDtype) -> Cache {
        match kv {
            KvDtype::F32 => Cache::F32(up(g, v)),
            KvDtype::Bf16 => {
                let bits: Vec<u16> = v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect();
                Cache::Bf16(g.stream.clone_htod(&bits).unwrap())
            }
        }
    }

    pub(super) fn view(&self) -> KvView<'_> {
        match self {
            Cache::F32(s) => KvView::F32(s.as_view()),
            Cache::Bf16(s) => KvView::Bf16(s.as_view()),
        }
    }

    pub(super) fn view_mut(&mut self) -> KvViewMut<'_> {
        match self {
            Cache::F32(s) => KvViewMut::F32(s.as_view_mut()),
            Cache::Bf16(s) => KvViewMut::Bf16(s.as_view_mut()),
        }
    }

    /// The values, widened to f32.
    pub(super) fn down(&self, g: &Gpu) -> Vec<f32> {
        kv_down(g, &self.view())
    }
}

const KV_DTYPES: [KvDtype; 2] = [KvDtype::F32, KvDtype::Bf16];

/// Also with bf16 activations, where every step takes the tensor-core kernel's one-MMA twins
/// (`attention_tc1_*`: Q, P and f32 caches rounded to TF32), held to 3e-3 of the f32 reference.
#[test]
fn split_attention_matches_reference() {
    let mut g = gpu();
    let cases = [
        (1, 1, 2, 1, 32, Some(0)),
        (4, 9, 4, 2, 32, Some(5)),
        (7, 70, 4, 2, 64, None),
        // The tensor-core kernel (more than 4 queries per KV head): slices a row cannot see at
        // all, a partial last tile, two query groups per KV head.
        (4, 100, 8, 2, 64, Some(10)),
        (2, 300, 32, 8, 128, Some(298)),
        (16, 600, 32, 8, 128, Some(584)),
        (3, 100, 4, 4, 256, Some(97)),
        (1, 512, 32, 8, 128, Some(511)),
        // The one-row kernel's block of four queries holding two causal rows (G = 2: the rows
        // see different key counts) or two queries only, with slices ending inside a warp's
        // eight keys of a tile.
        (2, 37, 4, 2, 64, Some(35)),
        (2, 299, 8, 4, 128, Some(297)),
        (1, 45, 4, 2, 128, Some(44)),
        (8, 520, 32, 8, 128, Some(512)),
        (1, 4096, 32, 8, 128, Some(4095)),
        (8, 4103, 32, 8, 128, Some(4095)),
        (7, 4103, 32, 8, 128, None),
        // One query head per KV head (G = 1) and five (G = 5, Qwen3-14B's 40 / 8): the query
        // index's row and head come from a multiply by ⌈2³²/G⌉, with G = 1 taken apart.
        (1, 50, 8, 8, 64, Some(49)),
        (5, 77, 4, 4, 128, Some(72)),
        (1, 300, 40, 8, 128, Some(299)),
        (3, 90, 40, 8, 128, Some(87)),
    ];
    // As eager steps launch it (the grid fits kv_len), then as a captured graph does: the grid
    // sized for the next power of two of keys, the cache rows past kv_len poisoned.
    for (activations, tol) in [(Activations::F32, 1e-5), (Activations::Bf16, 3e-3)] {
        g.set_activations(activations).unwrap();
        for kv in KV_DTYPES {
            for graph_grid in [false, true] {
                g.set_profiling(true).unwrap();
                check_attention(
                    &g,
                    12,
                    &format!("split attention, {activations:?} activations"),
                    &cases,
                    (kv, graph_grid, tol),
                    |q, k, v, out, lens, (rows, _, nh, nkv, hd, c)| {
                        let mut sc = scratch(&g, nh, hd);
                        let heads = (nh, nkv, hd);
                        g.attention_split(q, k, v, (out, false), rows, lens, heads, c.is_some(), &mut sc).unwrap();
                    },
                );
                let kernels = g.take_profile().unwrap();
                g.set_profiling(false).unwrap();
                let one_mma = kernels.iter().any(|k| k.name.starts_with("attention_tc1_"));
                assert_eq!(one_mma, activations == Activations::Bf16, "{activations:?}: {kernels:?}");
            }
        }
    }
}

#[test]
fn attention_causal_and_bidirectional() {
    let g = gpu();
    let cases = [
        (1, 1, 2, 1, 32, Some(0)),
        (4, 9, 4, 2, 32, Some(5)),
        (8, 520, 32, 8, 128, Some(512)),
        (7, 70, 4, 2, 64, None),
        (7, 4103, 32, 8, 128, None),
    ];
    for kv in KV_DTYPES {
        check_attention(
            &g,
            6,
            "attention",
            &cases,
            (kv, false, 1e-5),
            |q, k, v, out, lens, (rows, _, nh, nkv, hd, c)| {
                g.attention(q, k, v, out, rows, lens, (nh, nkv, hd), c.is_some()).unwrap();
            },
        );
    }
}

#[test]
fn attention_refuses_mixed_cache_types() {
    let g = gpu();
    let (nh, nkv, hd) = (2, 1, 32);
    let q = up(&g, &[0.5; 32 * 2]);
    let kf = Cache::up(&g, &[0.5; 32], KvDtype::F32);
    let vb = Cache::up(&g, &[0.5; 32], KvDtype::Bf16);
    let lens_d = g.stream.clone_htod(&[0u32, 1]).unwrap();
    let lens = StepLens { dev: lens_d.as_view(), first_pos: 0, kv_cap: 1 };
    let mut out = poisoned(&g, nh * hd);
    let mut sc = scratch(&g, nh, hd);
    let heads = (nh, nkv, hd);
    let e = g.attention_split(
        &q.as_view(),
        &kf.view(),
        &vb.view(),
        (&mut out.as_view_mut(), false),
        1,
        &lens,
        heads,
        true,
        &mut sc,
    );
    assert!(e.unwrap_err().to_string().contains("K cache is f32, V cache bf16"));
    assert!(g.attention(&q.as_view(), &kf.view(), &vb.view(), &mut out.as_view_mut(), 1, &lens, heads, true).is_err());
}

/// With `out_bf16` the split attention's combine writes bf16 rows for an `_x1h` consumer: each
/// value the f32 output rounded, for the four-query and the tensor-core kernels and both cache
/// types; the per-head kernel (past 16 rows) writes f32 only and refuses.
#[test]
fn bf16_output_rows_are_the_f32_rows_rounded() {
    let g = gpu();
    let mut rng = Rng(67);
    let (nh, nkv, hd, kv_len) = (32, 8, 128, 300);
    let width = nh * hd;
    for kv in KV_DTYPES {
        let (kd, vd) = random_caches(&g, &mut rng, kv_len * nkv * hd, kv);
        let mut sc = scratch(&g, nh, hd);
        for rows in [1, 8, 16, 17] {
            let first_pos = kv_len - rows;
            let qd = up(&g, &rng.vec(rows * width));
            let lens_d = g.stream.clone_htod(&[first_pos as u32, kv_len as u32]).unwrap();
            let lens = StepLens { dev: lens_d.as_view(), first_pos, kv_cap: kv_len };
            let run = |sc: &mut OpScratch, bf16: bool| {
                let mut out = poisoned(&g, rows * width);
                let heads = (nh, nkv, hd);
                let r = g.attention_split(
                    &qd.as_view(),
                    &kd.view(),
                    &vd.view(),
                    (&mut out.as_view_mut(), bf16),
                    rows,
                    &lens,
                    heads,
                    true,
                    sc,
                );
                r.map(|()| down(&g, &out))
            };
            let f32s = run(&mut sc, false).unwrap();
            let what = format!("{} cache, {rows} rows", kv.name());
            if rows > 16 {
                let e = run(&mut sc, true).unwrap_err().to_string();
                assert!(e.contains("per-head kernel"), "{what}: {e}");
                continue;
            }
            let rows16 = run(&mut sc, true).unwrap();
            let got: Vec<u16> = rows16[..rows * width / 2]
                .iter()
                .flat_map(|x| {
                    let b = x.to_bits();
                    [b as u16, (b >> 16) as u16]
                })
                .collect();
            let want: Vec<u16> = f32s.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
            assert_eq!(got, want, "{what}: bf16 rows are not the f32 rows rounded");
            assert!(rows16[rows * width / 2..].iter().all(|x| x.is_nan()), "{what}: wrote past its bf16 rows");
        }
    }
}

/// (rows, kv_len, n_heads, n_kv_heads, head_dim, causal first position)
type AttnCase = (usize, usize, usize, usize, usize, Option<usize>);

/// Runs `launch` on every case (the Qwen3-8B-sized ones only in the full-size pass) with fresh
/// random q, k, v and a poisoned output, and checks it against the CPU reference at 1e-5 (fed
/// the cache's values: bf16-rounded keys and values for a bf16 cache). The positions go in
/// device memory (`StepLens`); with `graph_grid` the launch is sized for the next power of two
/// of keys, as a captured graph's is, and the K/V rows past `kv_len` are NaN.
fn check_attention(
    g: &Gpu,
    seed: u64,
    what: &str,
    cases: &[AttnCase],
    (kv, graph_grid, tol): (KvDtype, bool, f32),
    launch: impl Fn(&CudaView<f32>, &KvView<'_>, &KvView<'_>, &mut CudaViewMut<f32>, &StepLens<'_>, AttnCase),
) {
    let mut rng = Rng(seed);
    for &case in cases.iter().filter(|s| full_size() || s.1 < 1000) {
        let (rows, kv_len, nh, nkv, hd, causal) = case;
        let q = rng.vec(rows * nh * hd);
        let mut k = rng.vec(kv_len * nkv * hd);
        let mut v = rng.vec(kv_len * nkv * hd);
        if kv == KvDtype::Bf16 {
            k.iter_mut().chain(v.iter_mut()).for_each(|x| *x = round_bf16(*x));
        }
        let mask = match causal {
            Some(p) => cpu::attention::Mask::Causal { first_pos: p },
            None => cpu::attention::Mask::None,
        };
        let shape = cpu::attention::AttnShape { rows, kv_len, n_heads: nh, n_kv_heads: nkv, head_dim: hd };
        let want = cpu::attention::attention(&q, &k, &v, shape, mask);
        let kv_cap = if graph_grid { kv_len.next_power_of_two() } else { kv_len };
        k.resize(kv_cap * nkv * hd, f32::NAN);
        v.resize(kv_cap * nkv * hd, f32::NAN);
        let (qd, kd, vd) = (up(g, &q), Cache::up(g, &k, kv), Cache::up(g, &v, kv));
        let lens_d = g.stream.clone_htod(&[causal.unwrap_or(0) as u32, kv_len as u32]).unwrap();
        let lens = StepLens { dev: lens_d.as_view(), first_pos: causal.unwrap_or(0), kv_cap };
        let mut out = poisoned(g, rows * nh * hd);
        launch(&qd.as_view(), &kd.view(), &vd.view(), &mut out.as_view_mut(), &lens, case);
        let e = rel_err(&down(g, &out), &want);
        let name = kv.name();
        assert!(e <= tol, "{what} ({name} cache) rows {rows} kv {kv_len} (grid for {kv_cap}) hd {hd} {causal:?}: {e}");
    }
}

#[test]
fn qkv_rope_append_matches_reference() {
    let g = gpu();
    let mut rng = Rng(13);
    let shapes = [(1, 2, 1, 32, 0), (5, 4, 2, 64, 17), (3, 0, 2, 32, 9), (8, 32, 8, 128, 4000), (3, 8, 2, 128, 40000)];
    for kv in KV_DTYPES {
        for (rows, nq, nkv, hd, first_pos) in shapes.into_iter().filter(|s| full_size() || s.1 < 8) {
            let heads = nq + 2 * nkv;
            let qkv = rng.vec(rows * heads * hd);
            let (qn, kn) = (rng.vec(hd), rng.vec(hd));
            let freqs = cpu::rope::inv_freq(1e6, hd);
            let positions: Vec<usize> = (first_pos..first_pos + rows).collect();
            let part = |lo: usize, n: usize| -> Vec<f32> {
                (0..rows).flat_map(|r| qkv[(r * heads + lo) * hd..][..n * hd].to_vec()).collect()
            };
            let (mut wq, mut wk, wv) = (part(0, nq), part(nq, nkv), part(nq + nkv, nkv));
            if nq > 0 {
                cpu::rmsnorm::rmsnorm_inplace(&mut wq, &qn, 1e-6);
                cpu::rope::rope_inplace(&mut wq, &positions, nq, &freqs);
            }
            cpu::rmsnorm::rmsnorm_inplace(&mut wk, &kn, 1e-6);
            cpu::rope::rope_inplace(&mut wk, &positions, nkv, &freqs);
            let cache_row = first_pos; // a step's rows go to the cache rows of their positions
            let cache_len = (cache_row + rows + 3) * nkv * hd;
            let lens_d = g.stream.clone_htod(&[first_pos as u32, (first_pos + rows) as u32]).unwrap();
            let lens = StepLens { dev: lens_d.as_view(), first_pos, kv_cap: first_pos + rows };
            let (qd, qnd, knd, fd) = (up(&g, &qkv), up(&g, &qn), up(&g, &kn), up(&g, &freqs));
            let mut q_out = poisoned(&g, (rows * nq * hd).max(1));
            let mut kc = Cache::up(&g, &vec![f32::NAN; cache_len], kv);
            let mut vc = Cache::up(&g, &vec![f32::NAN; cache_len], kv);
            g.qkv_rope_append(
                &qd.as_view(),
                &qnd.as_view(),
                &knd.as_view(),
                &fd.as_view(),
                &mut q_out.slice_mut(..rows * nq * hd),
                &mut kc.view_mut(),
                &mut vc.view_mut(),
                (rows, nq, nkv),
                &lens,
                1e-6,
            )
            .unwrap();
            let span = cache_row * nkv * hd..(cache_row + rows) * nkv * hd;
            let (kh, vh) = (kc.down(&g), vc.down(&g));
            let name = kv.name();
            if nq > 0 {
                let e = rel_err(&down(&g, &q_out)[..rows * nq * hd], &wq);
                assert!(e <= 2e-5, "qkv_rope_append q ({name} cache): {e}");
            }
            // Angles up to 4e4 rad: cos/sin of a large f32 argument differ by an ulp or two
            // between the device's and the host's libm, which shows at ~1e-5 of the values
            // (hence 2e-5); a bf16 cache adds at most one bf16 step (module doc).
            let (k_tol, round): (f32, fn(f32) -> f32) = match kv {
                KvDtype::F32 => (2e-5, |x| x),
                KvDtype::Bf16 => (2e-5 + 1.0 / 256.0, round_bf16),
            };
            let wk: Vec<f32> = wk.iter().map(|&x| round(x)).collect();
            let e = rel_err(&kh[span.clone()], &wk);
            assert!(e <= k_tol, "qkv_rope_append k ({name} cache): {e}");
            if kv == KvDtype::Bf16 {
                // Straddling a rounding boundary needs the two f32 keys within ~1e-5 of one:
                // rare (about 1 in 4000 here), so nearly every key is the reference's exactly.
                let off = kh[span.clone()].iter().zip(&wk).filter(|(a, b)| a != b).count();
                assert!(
                    off * 100 <= wk.len().max(200),
                    "qkv_rope_append k (bf16 cache): {off} of {} keys differ",
                    wk.len()
                );
            }
            let wv: Vec<f32> = wv.iter().map(|&x| round(x)).collect();
            assert_eq!(vh[span.clone()].to_vec(), wv, "qkv_rope_append v ({name} cache)");
            // Rows outside the appended span are left alone (still poisoned).
            assert!(kh[..span.start].iter().chain(&kh[span.end..]).all(|x| x.is_nan()));
            assert!(vh[..span.start].iter().chain(&vh[span.end..]).all(|x| x.is_nan()));
        }
    }
}

/// A query row's attention is the same bits in every step that holds it — the invariant that
/// makes batched rounds equal solo runs and speculative decoding equal plain decoding by
/// construction (`split_plan`: a slice takes every stride-th tile, the stride fixed by the
/// kernel, model and GPU). One random row at a random position goes through causal steps of 1
/// to 16 rows that hold it at random offsets, each launched as an eager step (grid for kv_len)
/// and as a graph's (grid for the next power of two of keys), over one cache; every launch must
/// give the row the same bits as the first one on the same kernel. On a row-exact GPU a one-row
/// step (decode) takes the tensor-core kernel too, so there all steps agree; on the default
/// GPU it takes the four-query kernel, whose steps are compared among themselves.
#[test]
fn a_row_is_the_same_bits_in_every_step_that_holds_it() {
    let mut rng = Rng(61);
    let shapes: &[(usize, usize, usize, usize)] = if full_size() {
        &[(32, 8, 128, 600), (32, 8, 128, 4300), (8, 2, 64, 300), (40, 8, 128, 200), (8, 8, 64, 100)]
    } else {
        &[(32, 8, 128, 600), (8, 2, 64, 300), (40, 8, 128, 200), (8, 8, 64, 100)]
    };
    // Row-exact (every step on the tensor-core kernel), the default, and bf16 activations (every
    // step on the one-MMA twins).
    for (row_exact, activations) in [(true, Activations::F32), (false, Activations::F32), (false, Activations::Bf16)] {
        let mut g = gpu();
        g.row_exact = row_exact;
        g.set_activations(activations).unwrap();
        let row_exact = g.rows_exact();
        for kv in KV_DTYPES {
            for &(nh, nkv, hd, max_len) in shapes {
                let cap = max_len.next_power_of_two();
                let (kd, vd) = random_caches(&g, &mut rng, cap * nkv * hd, kv);
                let mut sc = scratch(&g, nh, hd);
                let width = nh * hd;
                for _ in 0..4 {
                    let pos = rng.below(max_len);
                    let row = rng.vec(width);
                    // The first bits seen on each kernel: [four-query, tensor-core].
                    let mut first: [Option<(String, Vec<u32>)>; 2] = [None, None];
                    let mut compared = 0;
                    for rows in [1, 2, 3, 5, 8, 16, 1, 8] {
                        let lo = pos.saturating_sub(rows - 1);
                        let hi = pos.min(max_len - rows);
                        let first_pos = lo + rng.below(hi - lo + 1);
                        let kv_len = first_pos + rows;
                        let mut q = rng.vec(rows * width);
                        let j = pos - first_pos;
                        q[j * width..(j + 1) * width].copy_from_slice(&row);
                        for kv_cap in [kv_len, kv_len.next_power_of_two().min(cap)] {
                            let bits =
                                row_bits(&g, (&kd, &vd), &mut sc, &q, (first_pos, rows, kv_cap), (nh, nkv, hd), j);
                            let tc = usize::from(rows * (nh / nkv) > 4 || row_exact);
                            let what = format!("{rows} rows from {first_pos} (grid for {kv_cap} keys)");
                            match &first[tc] {
                                None => first[tc] = Some((what, bits)),
                                Some((w0, b0)) => {
                                    assert!(
                                        *b0 == bits,
                                        "row exact {row_exact}, {activations:?} activations, {} cache, {nh}/{nkv} heads hd {hd}: the row at {pos} \
                                         differs between {w0} and {what}",
                                        kv.name()
                                    );
                                    compared += 1;
                                }
                            }
                        }
                    }
                    assert!(compared >= 10, "{compared} comparisons");
                }
            }
        }
    }
}

/// Random K and V caches of `n` values each, rounded to bf16 first for a bf16 cache (so the two
/// element types hold the same values).
fn random_caches(g: &Gpu, rng: &mut Rng, n: usize, kv: KvDtype) -> (Cache, Cache) {
    let mut k = rng.vec(n);
    let mut v = rng.vec(n);
    if kv == KvDtype::Bf16 {
        k.iter_mut().chain(v.iter_mut()).for_each(|x| *x = round_bf16(*x));
    }
    (Cache::up(g, &k, kv), Cache::up(g, &v, kv))
}

/// The bits of row `j` of a causal split attention of `q`'s `rows` rows from `first_pos` over
/// the caches, launched with its grid sized for `kv_cap` keys, its output poisoned first.
fn row_bits(
    g: &Gpu,
    (k, v): (&Cache, &Cache),
    sc: &mut OpScratch,
    q: &[f32],
    (first_pos, rows, kv_cap): (usize, usize, usize),
    heads: (usize, usize, usize),
    j: usize,
) -> Vec<u32> {
    let width = heads.0 * heads.2;
    let qd = up(g, q);
    let lens_d = g.stream.clone_htod(&[first_pos as u32, (first_pos + rows) as u32]).unwrap();
    let lens = StepLens { dev: lens_d.as_view(), first_pos, kv_cap };
    let mut out = poisoned(g, rows * width);
    g.attention_split(
        &qd.as_view(),
        &k.view(),
        &v.view(),
        (&mut out.as_view_mut(), false),
        rows,
        &lens,
        heads,
        true,
        sc,
    )
    .unwrap();
    let bits: Vec<u32> = down(g, &out)[j * width..(j + 1) * width].iter().map(|x| x.to_bits()).collect();
    assert!(bits.iter().all(|b| !f32::from_bits(*b).is_nan()), "an unwritten output");
    bits
}
