//! The draft's context append for all layers in one launch (`cuda::kv_layers`) against the CPU
//! reference applied layer by layer: for every layer, k = RoPE(RMSNorm(k) · k_norm[l]) and v
//! copied into that layer's caches at the rows' positions. Every cache starts poisoned, so a
//! row written to the wrong layer or position, or not at all, fails; rows outside the appended
//! span must stay poisoned. Tolerance 2e-5, as for `qkv_rope_append` (the device's cos/sin of
//! large angles differ from the host's by an ulp or two); with bf16 caches, against the
//! reference rounded to bf16, plus one bf16 step for a key whose f32 values straddle a rounding
//! boundary (gpu_kernels/attention.rs). Both layouts of the input rows (token-major, after one
//! stacked projection; layer-major, after one projection a layer) against the same reference.

use super::*;
use dspark_kernels::cpu::round_bf16;
use dspark_kernels::cuda::kv::{KvCaches, KvDtype, LayersKv};
use dspark_kernels::cuda::kv_layers::{KvRowsLayout, LayerCaches};

/// `n` layers' caches of `len` values each, poisoned with NaN.
fn poisoned_caches(g: &Gpu, kv: KvDtype, n: usize, len: usize) -> KvCaches {
    match kv {
        KvDtype::F32 => KvCaches::F32 {
            k: (0..n).map(|_| poisoned(g, len)).collect(),
            v: (0..n).map(|_| poisoned(g, len)).collect(),
        },
        KvDtype::Bf16 => {
            let nan = || g.stream.clone_htod(&vec![bf16::NAN.to_bits(); len]).unwrap();
            KvCaches::Bf16 { k: (0..n).map(|_| nan()).collect(), v: (0..n).map(|_| nan()).collect() }
        }
    }
}

#[test]
fn kv_rope_append_layers_matches_reference() {
    let g = gpu();
    let mut rng = Rng(29);
    // (rows, layers, nkv, hd, first_pos): one row, the draft's CHUNK, DSpark-8B's five layers
    // of 8 KV heads at 128 at a long position.
    let shapes = [(1, 1, 1, 32, 0), (8, 3, 2, 64, 11), (4, 5, 8, 128, 30000)];
    let cases = [KvDtype::F32, KvDtype::Bf16]
        .into_iter()
        .flat_map(|d| [KvRowsLayout::TokenMajor, KvRowsLayout::LayerMajor].map(|l| (d, l)))
        .flat_map(|(d, l)| shapes.map(|s| (d, l, s)));
    for (kv_dtype, layout, (rows, layers, nkv, hd, first_pos)) in cases {
        let (width, row_len) = (layers * 2 * nkv * hd, nkv * hd);
        // The reference reads `kv` token-major; the launch gets it in `layout`'s order.
        let kv = rng.vec(rows * width);
        let per = 2 * nkv * hd;
        let launched: Vec<f32> = match layout {
            KvRowsLayout::TokenMajor => kv.clone(),
            KvRowsLayout::LayerMajor => (0..layers)
                .flat_map(|l| (0..rows).flat_map(move |r| (0..per).map(move |c| (l, r, c))))
                .map(|(l, r, c)| kv[r * width + l * per + c])
                .collect(),
        };
        let k_norm = rng.vec(layers * hd);
        let freqs = cpu::rope::inv_freq(1e6, hd);
        let positions: Vec<usize> = (first_pos..first_pos + rows).collect();
        let cache_rows = first_pos + rows + 2;
        let caches = poisoned_caches(&g, kv_dtype, layers, cache_rows * row_len);
        let ptrs = (g.stream.alloc_zeros::<u64>(layers).unwrap(), g.stream.alloc_zeros::<u64>(layers).unwrap());
        let mut lc = LayerCaches::new(&g, caches, ptrs, row_len).unwrap();
        assert_eq!((lc.layers(), lc.rows(), lc.dtype()), (layers, cache_rows, kv_dtype));
        let lens_d = g.stream.clone_htod(&[first_pos as u32, (first_pos + rows) as u32]).unwrap();
        let lens = StepLens { dev: lens_d.as_view(), first_pos, kv_cap: first_pos + rows };
        let (kvd, knd, fd) = (up(&g, &launched), up(&g, &k_norm), up(&g, &freqs));
        let norms = (&knd.as_view(), &fd.as_view());
        g.kv_rope_append_layers(&kvd.as_view(), norms, &mut lc, (rows, nkv), &lens, 1e-6, layout).unwrap();
        let span = first_pos * row_len..(first_pos + rows) * row_len;
        for l in 0..layers {
            // Layer l's k heads and v heads of every row.
            let part = |off: usize| -> Vec<f32> {
                (0..rows).flat_map(|r| kv[r * width + (l * 2 * nkv + off) * hd..][..nkv * hd].to_vec()).collect()
            };
            let (mut wk, wv) = (part(0), part(nkv));
            cpu::rmsnorm::rmsnorm_inplace(&mut wk, &k_norm[l * hd..(l + 1) * hd], 1e-6);
            cpu::rope::rope_inplace(&mut wk, &positions, nkv, &freqs);
            let (kc, vc) = lc.layer(l).expect("a layer of the stack");
            let (kh, vh) = (kv_down(&g, &kc), kv_down(&g, &vc));
            let (tol, round): (f32, fn(f32) -> f32) = match kv_dtype {
                KvDtype::F32 => (2e-5, |x| x),
                KvDtype::Bf16 => (2e-5 + 1.0 / 256.0, round_bf16),
            };
            let (wk, wv): (Vec<f32>, Vec<f32>) =
                (wk.iter().map(|&x| round(x)).collect(), wv.iter().map(|&x| round(x)).collect());
            let e = rel_err(&kh[span.clone()], &wk);
            assert!(e <= tol, "kv_rope_append_layers k ({kv_dtype:?}, {layout:?}), layer {l} of {layers}: {e}");
            assert_eq!(
                vh[span.clone()].to_vec(),
                wv,
                "kv_rope_append_layers v ({kv_dtype:?}, {layout:?}), layer {l} of {layers}"
            );
            for c in [&kh, &vh] {
                assert!(c[..span.start].iter().chain(&c[span.end..]).all(|x| x.is_nan()), "layer {l}: rows outside");
            }
        }
    }
}

#[test]
fn kv_rope_append_layers_refuses_bad_shapes() {
    let g = gpu();
    let ptrs = |n: usize| (g.stream.alloc_zeros::<u64>(n).unwrap(), g.stream.alloc_zeros::<u64>(n).unwrap());
    // Caches of unequal length, and too few address slots, are refused at construction.
    let f32s = |k: Vec<CudaSlice<f32>>, v: Vec<CudaSlice<f32>>| KvCaches::F32 { k, v };
    assert!(LayerCaches::new(&g, f32s(vec![poisoned(&g, 64)], vec![poisoned(&g, 32)]), ptrs(1), 32).is_err());
    assert!(LayerCaches::new(&g, poisoned_caches(&g, KvDtype::Bf16, 2, 64), ptrs(1), 32).is_err());
    // Two layers of 2 rows of one 32-wide head; appending at position 2 has no room.
    let mut lc = LayerCaches::new(&g, poisoned_caches(&g, KvDtype::F32, 2, 64), ptrs(2), 32).unwrap();
    let lens_d = g.stream.clone_htod(&[2u32, 3]).unwrap();
    let lens = StepLens { dev: lens_d.as_view(), first_pos: 2, kv_cap: 3 };
    let (kv, kn, f) = (poisoned(&g, 2 * 2 * 32), poisoned(&g, 2 * 32), poisoned(&g, 16));
    let err = g.kv_rope_append_layers(
        &kv.as_view(),
        (&kn.as_view(), &f.as_view()),
        &mut lc,
        (1, 1),
        &lens,
        1e-6,
        KvRowsLayout::TokenMajor,
    );
    assert!(err.is_err_and(|e| e.to_string().contains("cache rows")));
    // A k_norm that is not one head_dim row per layer.
    let lens_d = g.stream.clone_htod(&[0u32, 1]).unwrap();
    let lens = StepLens { dev: lens_d.as_view(), first_pos: 0, kv_cap: 1 };
    let kn1 = poisoned(&g, 32);
    let err = g.kv_rope_append_layers(
        &kv.as_view(),
        (&kn1.as_view(), &f.as_view()),
        &mut lc,
        (1, 1),
        &lens,
        1e-6,
        KvRowsLayout::TokenMajor,
    );
    assert!(err.is_err_and(|e| e.to_string().contains("k_norm")));
    // A cache swapped for another buffer after its address was recorded.
    let kn2 = poisoned(&g, 2 * 32);
    if let LayersKv::F32(k, _) = lc.caches_mut() {
        k[1] = poisoned(&g, 64);
    }
    let err = g.kv_rope_append_layers(
        &kv.as_view(),
        (&kn2.as_view(), &f.as_view()),
        &mut lc,
        (1, 1),
        &lens,
        1e-6,
        KvRowsLayout::TokenMajor,
    );
    assert!(err.is_err_and(|e| e.to_string().contains("replaced")));
}
