//! The attention with qkv_rope_append folded in (`Gpu::rope_attention`, kernels/norm_rope.cuh)
//! against the same op unfolded (the append launch, then the split attention, which the tests
//! in `attention.rs` check against the CPU reference): the same bits in the output and in both
//! caches, every row of them, on fresh random inputs. The cache rows of the step are poisoned
//! before each run, so a folded kernel that used a row it had not written, or left one unwritten,
//! would differ (NaN); cache rows before them hold random keys and values, as earlier steps left
//! them. A profile of the folded run shows that the folded kernel ran.

use super::attention::Cache;
use super::*;
use dspark_kernels::cpu::round_bf16;
use dspark_kernels::cuda::kv::KvDtype;
use dspark_kernels::cuda::rope_fold::RopeWeights;

/// (rows, first position, n_heads, n_kv_heads, head_dim, causal)
type FoldCase = (usize, usize, usize, usize, usize, bool);

#[test]
fn folded_rope_attention_matches_the_two_launches() {
    let mut g = gpu();
    let mut rng = Rng(29);
    let cases: [FoldCase; 12] = [
        // Decode (the split kernel of one row): Qwen3-8B's heads at the start, inside a tile,
        // on a tile's last key, at 4096 keys (two tiles a slice); G = 2 with two rows.
        (1, 0, 32, 8, 128, true),
        (1, 37, 32, 8, 128, true),
        (1, 511, 32, 8, 128, true),
        (1, 4095, 32, 8, 128, true),
        (2, 60, 4, 2, 64, true),
        (1, 9, 2, 1, 64, true),
        // Verify and draft block: the tensor-core kernel, which does not fold (rope_fold.rs), so
        // the op takes the two launches either way.
        (8, 512, 32, 8, 128, true),
        (7, 300, 32, 8, 128, false),
        // Four rows of one query head each (G = 1): the folded kernel, one row a warp, rows
        // across a tile boundary; bidirectional from position 0.
        (4, 30, 8, 8, 64, true),
        (4, 0, 8, 8, 128, false),
        (3, 4094, 8, 8, 128, true),
        (2, 31, 16, 8, 64, true),
    ];
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        for &(rows, first_pos, nh, nkv, hd, causal) in cases.iter().filter(|c| full_size() || c.1 < 1000) {
            let heads = nh + 2 * nkv;
            let kv_len = first_pos + rows;
            let qkv = rng.vec(rows * heads * hd);
            let (qn, kn) = (rng.vec(hd), rng.vec(hd));
            let freqs = cpu::rope::inv_freq(1e6, hd);
            // Earlier steps' rows: random (as a bf16 cache holds them); the step's rows and the
            // rest of a graph-sized cache: NaN.
            let kv_cap = kv_len.next_power_of_two().max(kv_len + 5);
            let mut old: Vec<f32> = rng.vec(first_pos * nkv * hd);
            if kv == KvDtype::Bf16 {
                old.iter_mut().for_each(|x| *x = round_bf16(*x));
            }
            old.resize(kv_cap * nkv * hd, f32::NAN);
            let mut old_v: Vec<f32> = rng.vec(first_pos * nkv * hd);
            old_v.resize(kv_cap * nkv * hd, f32::NAN);
            let lens_d = g.stream.clone_htod(&[first_pos as u32, kv_len as u32]).unwrap();
            let lens = StepLens { dev: lens_d.as_view(), first_pos, kv_cap };
            let (qd, qnd, knd, fd) = (up(&g, &qkv), up(&g, &qn), up(&g, &kn), up(&g, &freqs));
            let mut runs = Vec::new();
            for fold in [false, true] {
                g.rope_fold = fold;
                let (mut kc, mut vc) = (Cache::up(&g, &old, kv), Cache::up(&g, &old_v, kv));
                let mut q_rot = poisoned(&g, rows * nh * hd);
                let mut out = poisoned(&g, rows * nh * hd);
                let mut sc = scratch(&g, nh, hd);
                let rope =
                    RopeWeights { q_norm: &qnd.as_view(), k_norm: &knd.as_view(), inv_freq: &fd.as_view(), eps: 1e-6 };
                g.set_profiling(true).unwrap();
                g.rope_attention(
                    &qd.as_view(),
                    &rope,
                    &mut q_rot.as_view_mut(),
                    (&mut kc.view_mut(), &mut vc.view_mut()),
                    (&mut out.as_view_mut(), false),
                    rows,
                    &lens,
                    (nh, nkv, hd),
                    causal,
                    &mut sc,
                )
                .unwrap();
                g.set_profiling(false).unwrap();
                let names: Vec<String> = g.take_profile().unwrap().into_iter().map(|k| k.name).collect();
                let folded = names.iter().any(|n| n.starts_with("attention_split_rope_q1_"));
                let takes = fold && rows * (nh / nkv) <= 4; // the folded kernel's one block of four queries
                assert_eq!(folded, takes, "{names:?}: fold {fold}, rows {rows}, heads {nh}/{nkv}");
                let out_bits: Vec<u32> = down(&g, &out).into_iter().map(f32::to_bits).collect();
                assert!(down(&g, &out).iter().all(|x| x.is_finite()), "fold {fold}: output not all written");
                let bits = |c: &Cache| c.down(&g).into_iter().map(f32::to_bits).collect::<Vec<_>>();
                runs.push((out_bits, bits(&kc), bits(&vc)));
            }
            let what =
                format!("{} cache, rows {rows} at {first_pos}, heads {nh}/{nkv}, hd {hd}, causal {causal}", kv.name());
            assert!(runs[0].0 == runs[1].0, "{what}: the output differs from the unfolded op's");
            assert!(runs[0].1 == runs[1].1, "{what}: the K cache differs from the unfolded op's");
            assert!(runs[0].2 == runs[1].2, "{what}: the V cache differs from the unfolded op's");
        }
    }
    g.rope_fold = true;
}
