//! Paged K/V on the GPU (`CudaBatch::paged`, `--kv-capacity`, issue #30): pages of physical
//! memory mapped into each sequence's address range (`cuda::kv_vmm`).
//!
//! A paged batch and a contiguous one run the same random forwards — prompts through the GEMM
//! prefill, verify-shaped steps of several sequences at once, rollbacks across page boundaries —
//! and give the same ids and captures bit for bit (the kernels are the same; only where the rows
//! live differs). Pages are mapped exactly for what each sequence holds, come back on rollback
//! and close, a forward past the free pages is a clear error (not a fault) after which the batch
//! still serves, and `with_target` runs a plain loop within the pages it can get.

use super::*;
use dspark_kernels::KvDtype;
use dspark_model::cuda::qwen3::CudaBatch;
use dspark_model::BatchTarget;

/// Bit-for-bit equality of two f32 slices.
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn paged_caches_equal_contiguous_ones_and_give_their_pages_back() {
    // Rows of 4 KV heads of 128: 2 KiB in f32 (1,024 positions a 2 MiB page), 1 KiB in bf16
    // (2,048). The lengths drawn scale with the page, so both dtypes cross page boundaries.
    const MAX_LEN: usize = 6144;
    let cfg = target_config(96, 128, 2, 8, 4, 128, MAX_LEN);
    let (_dir, tdir, _ddir) = write_pair(&cfg, 77, &two_layer_draft(4, MarkovKind::Vanilla, false), DType::BF16);
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        let load = || CudaQwen3::load_kv(gpu(), &tdir, MAX_LEN, kv).unwrap();
        let mut plain = CudaBatch::new(load(), 3).unwrap();
        let capacity = 5000 * 4 / kv.bytes();
        let mut paged = CudaBatch::paged(load(), 3, capacity).unwrap();
        let budget = paged.kv_budget().unwrap();
        let (page, total) = (budget.page, budget.pages);
        assert!(page >= 1024 && total * page >= capacity, "{kv:?}: {budget:?}");
        // Sequences of up to three pages; long items of a tenth of a page to most of one.
        let cap = (3 * page).min(MAX_LEN);
        assert_eq!(paged.kv_pages_free(), Some(total));
        for b in [&mut plain, &mut paged] {
            b.set_capture(&[0, 1]).unwrap();
        }
        let ids: Vec<usize> = (0..3).map(|_| (plain.open().unwrap(), paged.open().unwrap()).1).collect();
        let mut rng = Rng(kv as u64 + 5);
        let (mut crossed, mut shrunk, mut items_run) = (0, 0, 0);
        for round in 0..36 {
            let mut items: Vec<(usize, Vec<u32>, LogitRows)> = Vec::new();
            // Pages this round's items take beyond what their sequences hold.
            let mut planned = 0;
            for &id in &ids {
                let len = paged.seq_len(id).unwrap();
                let held: usize = ids.iter().map(|&i| paged.seq_len(i).unwrap().div_ceil(page)).sum();
                let n = if rng.below(3) == 0 { (100 + rng.below(600)) * page / 1024 } else { 1 + rng.below(12) };
                let room = (total - held - planned + len.div_ceil(page)) * page;
                if rng.below(5) == 0 || len + n > cap.min(room) {
                    // Roll back to a random length (often across a page boundary).
                    let keep = rng.below(len + 1);
                    shrunk += usize::from(keep.div_ceil(page) < len.div_ceil(page));
                    plain.truncate(id, keep).unwrap();
                    paged.truncate(id, keep).unwrap();
                    continue;
                }
                crossed += usize::from((len + n).div_ceil(page) > len.div_ceil(page).max(1));
                planned += (len + n).div_ceil(page) - len.div_ceil(page);
                let tokens: Vec<u32> = (0..n).map(|_| rng.below(96) as u32).collect();
                items.push((id, tokens, if n > 64 { LogitRows::Last } else { LogitRows::All }));
            }
            if !items.is_empty() {
                let run: Vec<(usize, &[u32], LogitRows)> =
                    items.iter().map(|(i, t, r)| (*i, t.as_slice(), *r)).collect();
                let a = plain.forward_batch(&run).unwrap();
                let a_caps: Vec<Vec<f32>> = a.iter().map(|g| plain.host_captures(&g.captured).unwrap()).collect();
                let b = paged.forward_batch(&run).unwrap();
                let b_caps: Vec<Vec<f32>> = b.iter().map(|g| paged.host_captures(&g.captured).unwrap()).collect();
                for (j, (id, tokens, _)) in items.iter().enumerate() {
                    let name = format!("{kv:?}, round {round}, sequence {id}, {} rows", tokens.len());
                    assert_eq!(a[j].ids, b[j].ids, "{name}: ids");
                    assert!(same(&a_caps[j], &b_caps[j]), "{name}: captures differ");
                    items_run += 1;
                }
            }
            let held: usize = ids.iter().map(|&i| paged.seq_len(i).unwrap().div_ceil(page)).sum();
            assert_eq!(paged.kv_pages_free(), Some(total - held), "{kv:?}, round {round}: pages mapped = held");
        }
        assert!(
            items_run >= 40 && crossed >= 3 && shrunk >= 2,
            "{kv:?}: {items_run} items, {crossed} crossings, {shrunk} shrinks, {budget:?}"
        );
        // More rows than the free pages hold: an error naming the capacity, nothing run.
        let (id, len) = (ids[0], paged.seq_len(ids[0]).unwrap());
        let free = paged.kv_pages_free().unwrap_or(0);
        let over = (len.div_ceil(page) + free) * page + 1 - len;
        if len + over <= MAX_LEN {
            let tokens = vec![1u32; over];
            let e = paged.forward_batch(&[(id, &tokens, LogitRows::Last)]).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains("KV cache is full"), "{kv:?}: {e}");
            assert_eq!(paged.seq_len(id).unwrap(), len);
        }
        for &i in &ids {
            paged.truncate(i, 0).unwrap();
        }
        assert_eq!(paged.kv_pages_free(), Some(total), "{kv:?}: every page back");
        // A plain loop on one sequence (the server's cost table) within the pages it can get;
        // its pages past what it holds are unmapped after.
        let mut ran = 0;
        paged
            .with_target(ids[1], &mut |t| {
                let f = t.forward(&(0..80).map(|i| i as u32 % 96).collect::<Vec<_>>(), LogitRows::Last)?;
                ran = f.rows;
                t.truncate(40)
            })
            .unwrap();
        assert_eq!((ran, paged.seq_len(ids[1]).unwrap()), (1, 40));
        assert_eq!(paged.kv_pages_free(), Some(total - 1));
        for &i in &ids {
            paged.close(i).unwrap();
        }
        assert_eq!(paged.kv_pages_free(), Some(total), "{kv:?}: closed sequences give their pages back");
    }
}
