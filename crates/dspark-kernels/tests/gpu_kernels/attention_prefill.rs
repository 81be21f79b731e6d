//! The prefill attention (`Gpu::attention_prefill`, bf16 tensor cores) against the f32 CPU
//! reference on fresh random inputs: head dims 64 and 128, G = 4 and 1 query heads per KV head,
//! chunks of 1 to 515 rows (partial query tiles of the kernel's 128), first at position 0 and
//! after 300 cached rows, f32 and bf16 caches (the bf16 cache holds values rounded to bf16 and
//! the reference is fed the same rounded values).
//!
//! Tolerance, per output: |got − want| ≤ 2e-2 · max |want| + 1e-3. The kernel rounds Q, K, V and
//! P to bf16 for its MMAs (8 significant bits: 2⁻⁹ relative each), so it is not held to the f32
//! kernels' 1e-5; the softmax and the accumulations are f32. Outputs are poisoned with NaN, one
//! row past the chunk stays poisoned (no write past `rows`), and the cache rows past kv_len are
//! NaN (the kernel must not read them; a captured graph's cache is sized for more).

use super::attention::Cache;
use super::*;
use dspark_kernels::cpu::round_bf16;
use dspark_kernels::cuda::kv::KvDtype;

const REL_TOL: f32 = 2e-2;
const ABS_TOL: f32 = 1e-3;

/// The largest |got − want| (infinite where got is not finite) and the case's allowed error.
fn worst_and_tol(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| if a.is_finite() { (a - b).abs() } else { f32::INFINITY })
        .fold(0f32, f32::max);
    (worst, REL_TOL * scale + ABS_TOL)
}

/// (rows, first_pos, n_heads, n_kv_heads, head_dim)
type PrefillCase = (usize, usize, usize, usize, usize);

/// One launch on fresh random inputs against the CPU reference (see the module doc).
fn check_prefill(g: &Gpu, rng: &mut Rng, kv: KvDtype, (rows, first_pos, nh, nkv, hd): PrefillCase) {
    let kv_len = first_pos + rows;
    let q = rng.vec(rows * nh * hd);
    let mut k = rng.vec(kv_len * nkv * hd);
    let mut v = rng.vec(kv_len * nkv * hd);
    if kv == KvDtype::Bf16 {
        k.iter_mut().chain(v.iter_mut()).for_each(|x| *x = round_bf16(*x));
    }
    let shape = cpu::attention::AttnShape { rows, kv_len, n_heads: nh, n_kv_heads: nkv, head_dim: hd };
    let want = cpu::attention::attention(&q, &k, &v, shape, cpu::attention::Mask::Causal { first_pos });
    // The cache holds more rows than the step's keys, NaN past kv_len.
    let kv_cap = kv_len + 40;
    k.resize(kv_cap * nkv * hd, f32::NAN);
    v.resize(kv_cap * nkv * hd, f32::NAN);
    let (qd, kd, vd) = (up(g, &q), Cache::up(g, &k, kv), Cache::up(g, &v, kv));
    let lens_d = g.stream.clone_htod(&[first_pos as u32, kv_len as u32]).unwrap();
    let lens = StepLens { dev: lens_d.as_view(), first_pos, kv_cap };
    let n_out = rows * nh * hd;
    let mut out = poisoned(g, n_out + nh * hd);
    g.set_profiling(true).unwrap();
    let heads = (nh, nkv, hd);
    g.attention_prefill(&qd.as_view(), &kd.view(), &vd.view(), &mut out.slice_mut(..n_out), rows, &lens, heads)
        .unwrap();
    let ran: Vec<String> = g.take_profile().unwrap().into_iter().map(|t| t.name).collect();
    g.set_profiling(false).unwrap();
    let name = format!("attention_prefill_hd{hd}_f32{}", kv.kernel_suffix());
    assert!(ran.len() == 1 && ran[0] == name, "kernels run: {ran:?}, expected {name}");
    let got = down(g, &out);
    let what = format!("{name}: rows {rows} first_pos {first_pos} heads {nh}/{nkv}");
    let (worst, tol) = worst_and_tol(&got[..n_out], &want);
    assert!(worst <= tol, "{what}: max |got − want| {worst} > {tol}");
    assert!(got[n_out..].iter().all(|x| x.is_nan()), "{what}: wrote past the chunk's rows");
}

#[test]
fn prefill_attention_matches_reference() {
    let g = gpu();
    let mut rng = Rng(61);
    let mut cases: Vec<PrefillCase> = Vec::new();
    for hd in [64, 128] {
        // (n_heads, n_kv_heads): G = 4 and G = 1.
        for (nh, nkv) in [(8, 2), (2, 2)] {
            for rows in [1, 17, 64, 200, 515] {
                for first_pos in [0, 300] {
                    cases.push((rows, first_pos, nh, nkv, hd));
                }
            }
        }
    }
    // Qwen3-8B's heads over a longer chunk (8 query tiles, the diagonal off the tile grid).
    if full_size() {
        cases.push((1000, 24, 32, 8, 128));
    }
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        for &case in &cases {
            check_prefill(&g, &mut rng, kv, case);
        }
    }
}

/// The kernel's time on one Qwen3-8B layer of a 4000-token prefill (32 query heads, 8 KV heads,
/// head dim 128), both cache types; prints it. Not part of the tier: `cargo test --features
/// gpu-tests --test gpu_kernels prefill_attention_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn prefill_attention_timing() {
    let g = gpu();
    let mut rng = Rng(62);
    let (rows, nh, nkv, hd) = (4000usize, 32usize, 8usize, 128usize);
    let flops = 4.0 * (rows * (rows + 1) / 2) as f64 * (nh * hd) as f64;
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        let q = up(&g, &rng.vec(rows * nh * hd));
        let k = Cache::up(&g, &rng.vec(rows * nkv * hd), kv);
        let v = Cache::up(&g, &rng.vec(rows * nkv * hd), kv);
        let lens_d = g.stream.clone_htod(&[0u32, rows as u32]).unwrap();
        let lens = StepLens { dev: lens_d.as_view(), first_pos: 0, kv_cap: rows };
        let mut out = poisoned(&g, rows * nh * hd);
        let launch = |out: &mut CudaSlice<f32>| {
            g.attention_prefill(&q.as_view(), &k.view(), &v.view(), &mut out.as_view_mut(), rows, &lens, (nh, nkv, hd))
                .unwrap()
        };
        launch(&mut out); // warm-up
        g.set_profiling(true).unwrap();
        let reps = 10;
        for _ in 0..reps {
            launch(&mut out);
        }
        let prof = g.take_profile().unwrap();
        g.set_profiling(false).unwrap();
        let us = prof.iter().map(|t| t.micros).sum::<f64>() / reps as f64;
        assert!(down(&g, &out).iter().all(|x| x.is_finite()));
        println!(
            "attention_prefill {} cache, {rows} rows, heads {nh}/{nkv}, hd {hd}: {:.1} µs a layer, {:.0} TFLOP/s, {:.1} ms for 36 layers",
            kv.name(),
            us,
            flops / us * 1e-6,
            36.0 * us * 1e-3
        );
    }
}

#[test]
fn prefill_attention_refuses_bad_shapes() {
    let g = gpu();
    let (rows, nkv) = (4usize, 2usize);
    let lens_d = g.stream.clone_htod(&[0u32, rows as u32]).unwrap();
    let lens = StepLens { dev: lens_d.as_view(), first_pos: 0, kv_cap: rows };
    let attempt = |nh: usize, hd: usize, kv_values: usize, (kf, vf): (KvDtype, KvDtype), lens: &StepLens<'_>| {
        let q = up(&g, &vec![0.5; rows * nh * hd]);
        let (k, v) = (Cache::up(&g, &vec![0.5; kv_values], kf), Cache::up(&g, &vec![0.5; kv_values], vf));
        let mut out = poisoned(&g, rows * nh * hd);
        g.attention_prefill(&q.as_view(), &k.view(), &v.view(), &mut out.as_view_mut(), rows, lens, (nh, nkv, hd))
    };
    let f32s = (KvDtype::F32, KvDtype::F32);
    assert!(attempt(8, 128, rows * nkv * 128, f32s, &lens).is_ok());
    let err = |r: dspark_kernels::cuda::CudaResult<()>| r.unwrap_err().to_string();
    assert!(err(attempt(8, 96, rows * nkv * 96, f32s, &lens)).contains("head_dim 96"));
    assert!(err(attempt(5, 64, rows * nkv * 64, f32s, &lens)).contains("multiple of kv heads"));
    assert!(err(attempt(8, 64, rows * nkv * 64 - 1, f32s, &lens)).contains("attention_prefill k"));
    assert!(err(attempt(8, 64, rows * nkv * 64, (KvDtype::F32, KvDtype::Bf16), &lens)).contains("V cache bf16"));
    let short = StepLens { dev: lens_d.as_view(), first_pos: 1, kv_cap: rows };
    assert!(err(attempt(8, 64, rows * nkv * 64, f32s, &short)).contains("kv_cap"));
}
