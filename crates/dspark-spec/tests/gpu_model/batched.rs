//! Many requests in one CUDA target (issue #30): `CudaBatch` against each sequence alone.
//!
//! * one batched forward's items — several sequences' rows, verify-shaped or a prompt's, more
//!   rows than one step holds, prompts long enough for the GEMM prefill — give each item the
//!   ids, captures and (asked for at random, as a sampled request does) logits of the same
//!   tokens through its own `CudaQwen3` alone, bit for bit;
//! * batched speculative rounds (`dspark_spec::batched` over `CudaBatch` and the draft's
//!   `Sequences`) give every greedy request its solo CUDA greedy tokens, and at a fixed verify
//!   length its solo speculative round count; every sampled one (host rule on the batched
//!   logits, either draft law) its solo `speculative_sampled` tokens from the device sampler;
//!   a full pool of sequences is refused with a clear error.

use super::*;
use dspark_kernels::cpu::argmax::argmax_rows;
use dspark_kernels::KvDtype;
use dspark_model::cuda::dspark::CudaDrafts;
use dspark_model::cuda::qwen3::CudaBatch;
use dspark_model::{BatchDrafter, BatchTarget, Sequences};
use dspark_spec::verify_len::CostTable;
use dspark_spec::{batched, speculative_sampled, BatchLimits, BatchRequest, BatchVerify, DraftLaw, SamplingParams};

const MAX_LEN: usize = 128;

/// Bit-for-bit equality of two f32 slices.
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn batched_forward_items_equal_each_sequence_alone() {
    forward_items_equal_each_sequence_alone(gpu());
}

/// An FP8 target (Qwen's 128 × 128 blocks): batched forwards of up to 48 rows run the wide FP8
/// matvecs (`_w2_fp8`, `_w4_fp8`), whose rows must be each sequence's alone.
#[test]
fn batched_forward_items_equal_each_sequence_alone_fp8() {
    let cfg = target_config(300, 128, 3, 4, 2, 32, 512);
    let spec = two_layer_draft(4, MarkovKind::Vanilla, false);
    let (_dir, tdir, _ddir) = super::fp8::write_fp8_pair(&cfg, 8200, [128, 128], &spec);
    forward_items_on(gpu(), &tdir);
}

/// Random batched forwards on `g` against each item's sequence alone (also `row_exact.rs`).
pub(super) fn forward_items_equal_each_sequence_alone(g: Arc<Gpu>) {
    let (_dir, tdir, _ddir) = write_bf16_pair(3, &two_layer_draft(4, MarkovKind::Vanilla, false), DType::BF16);
    forward_items_on(g, &tdir);
}

/// Random batched forwards of the target in `tdir` against each item's sequence alone.
fn forward_items_on(g: Arc<Gpu>, tdir: &std::path::Path) {
    let seqs = 4;
    let mut batch = CudaBatch::new(CudaQwen3::load(g.clone(), tdir, MAX_LEN).unwrap(), seqs).unwrap();
    let taps = [0usize, 2];
    batch.set_capture(&taps).unwrap();
    let vocab = batch.config().vocab_size;
    let ids: Vec<usize> = (0..seqs).map(|_| batch.open().unwrap()).collect();
    let err = batch.open().unwrap_err().to_string();
    assert!(err.contains("in use"), "a fifth sequence: {err}");
    let mut solo: Vec<CudaQwen3> = (0..seqs).map(|_| CudaQwen3::load(g.clone(), tdir, MAX_LEN).unwrap()).collect();
    for s in &mut solo {
        s.set_capture(&taps).unwrap();
    }
    let mut rng = Rng(41);
    let (mut items_run, mut multi_step, mut long_run) = (0, 0, 0);
    for round in 0..40 {
        // A random subset of the sequences, each with 1–12 rows (a prompt of 65–90 sometimes).
        let mut items: Vec<(usize, Vec<u32>, LogitRows)> = Vec::new();
        for (s, &id) in ids.iter().enumerate() {
            if rng.below(4) == 0 {
                continue;
            }
            let len = batch.seq_len(id).unwrap();
            let want = if rng.below(8) == 0 { 65 + rng.below(26) } else { 1 + rng.below(12) };
            let n = want.min(MAX_LEN - len);
            if n == 0 {
                // Full: roll it back to a random length, on both sides.
                let keep = rng.below(len);
                batch.truncate(id, keep).unwrap();
                solo[s].truncate(keep).unwrap();
                continue;
            }
            let tokens: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
            let rows = if rng.below(2) == 0 { LogitRows::All } else { LogitRows::Last };
            items.push((s, tokens, rows));
        }
        if items.is_empty() {
            continue;
        }
        let short_rows: usize = items.iter().map(|it| it.1.len()).filter(|&n| n <= 64).sum();
        multi_step += usize::from(short_rows > 64);
        long_run += items.iter().filter(|it| it.1.len() > 64).count();
        let batch_items: Vec<(usize, &[u32], LogitRows)> =
            items.iter().map(|(s, t, r)| (ids[*s], t.as_slice(), *r)).collect();
        // Some items (a sampled request's) also take their rows' logits to the host.
        let want_logits: Vec<bool> = items.iter().map(|_| rng.below(3) == 0).collect();
        let got = batch.forward_batch_logits(&batch_items, &want_logits).unwrap();
        let (got, got_logits): (Vec<_>, Vec<_>) = got.into_iter().unzip();
        // Read every item's captures before any other forward overwrites them.
        let got_caps: Vec<Vec<f32>> = got.iter().map(|g| batch.host_captures(&g.captured).unwrap()).collect();
        for (j, ((s, tokens, rows), (g, caps))) in items.iter().zip(got.iter().zip(&got_caps)).enumerate() {
            let alone = solo[*s].forward(tokens, *rows).unwrap();
            let want: Vec<u32> = argmax_rows(&alone.logits, vocab).into_iter().map(|i| i as u32).collect();
            assert_eq!(g.ids, want, "round {round}, sequence {s}: ids of {} rows", tokens.len());
            match want_logits[j] {
                true => assert!(same(&got_logits[j], &alone.logits), "round {round}, sequence {s}: logits differ"),
                false => assert!(got_logits[j].is_empty(), "round {round}, sequence {s}: logits not asked for"),
            }
            assert!(
                same(caps, &alone.captured),
                "round {round}, sequence {s}: captures of {} rows differ from the sequence alone",
                tokens.len()
            );
            assert_eq!(batch.seq_len(ids[*s]).unwrap(), solo[*s].len(), "round {round}, sequence {s}: length");
            items_run += 1;
        }
    }
    assert!(
        items_run >= 80 && multi_step >= 1 && long_run >= 3,
        "{items_run} items, {multi_step} multi-step, {long_run} long"
    );
    for id in ids {
        batch.close(id).unwrap();
    }
    assert!(batch.close(0).is_err(), "closing a closed sequence");
}

#[test]
fn batched_rounds_equal_solo_runs_on_the_gpu() {
    rounds_equal_solo_runs(gpu(), 0..6);
}

/// Batched rounds of random requests on `g`'s targets and drafts against each request's solo
/// runs on it, for the target/draft pairs of `seeds` (also `row_exact.rs`).
pub(super) fn rounds_equal_solo_runs(g: Arc<Gpu>, seeds: std::ops::Range<u64>) {
    let kinds = [MarkovKind::Vanilla, MarkovKind::Gated, MarkovKind::Rnn];
    for seed in seeds {
        let mut rng = Rng(seed * 131 + 7);
        let spec = two_layer_draft(2 + rng.below(6), kinds[rng.below(3)], rng.below(2) == 1);
        let (_dir, tdir, ddir) = write_bf16_pair(seed + 20, &spec, DType::BF16);
        let max_batch = 1 + rng.below(5);
        let vocab = 96;
        let requests: Vec<BatchRequest> = (0..1 + rng.below(7))
            .map(|_| {
                let len = if rng.below(4) == 0 { 65 + rng.below(30) } else { 1 + rng.below(20) };
                BatchRequest {
                    prompt: (0..len).map(|_| rng.below(vocab) as u32).collect(),
                    opts: GenerateOptions { max_tokens: rng.below(30), eos_token_ids: vec![], logprobs: None },
                    // A third sampled, each with its own seed (temperature 0.7–1.1, top-p 0.9).
                    params: match rng.below(3) {
                        0 => SamplingParams {
                            temperature: 0.7 + 0.1 * rng.below(5) as f32,
                            top_k: 0,
                            top_p: 0.9,
                            min_p: 0.0,
                            seed: rng.below(1000) as u64,
                        },
                        _ => SamplingParams::greedy(),
                    },
                    arrival: rng.below(6),
                }
            })
            .collect();
        let fixed = (rng.below(3) > 0).then(|| 1 + rng.below(spec.block_size));
        let verify = match fixed {
            Some(k) => BatchVerify::Fixed(k),
            None => {
                let tokens = max_batch * (spec.block_size + 1);
                BatchVerify::Budget(CostTable { seconds: (1..=tokens).map(|n| 1.0 + 0.05 * n as f64).collect() })
            }
        };
        let target = CudaQwen3::load(g.clone(), &tdir, MAX_LEN).unwrap();
        let mut draft = CudaDraft::load(&ddir, &target).unwrap();
        // Every third seed on paged caches (`--kv-capacity`), the draft's contexts too: one
        // 2 MiB page holds 8,192 of these rows, so the budget is one page and the requests run
        // one at a time.
        let mut target = match seed % 3 {
            2 => {
                let t = CudaBatch::paged(target, max_batch, MAX_LEN).unwrap();
                draft.reserve_sequences_paged(max_batch, t.kv_budget().unwrap()).unwrap();
                assert_eq!(draft.ctx_pages_free(), Some(1 + 2 * max_batch), "seed {seed}: the draft's pages");
                t
            }
            _ => {
                draft.reserve_sequences(max_batch).unwrap();
                CudaBatch::new(target, max_batch).unwrap()
            }
        };
        // The draft's blocks one sequence at a time, or in batched passes (`CudaDrafts`).
        let seq = seed % 2 == 0;
        let mut draft: Box<dyn BatchDrafter> =
            if seq { Box::new(Sequences::new(draft)) } else { Box::new(CudaDrafts::new(draft)) };
        let law = if seed % 2 == 0 { DraftLaw::Greedy } else { DraftLaw::Sampled };
        let limits = BatchLimits { max_batch, kv_capacity: None, prefill_chunk: None, law };
        let out = batched(&mut target, draft.as_mut(), &requests, &verify, limits).unwrap();
        if let Some(b) = target.kv_budget() {
            assert_eq!(b.pages, 1, "seed {seed}: {b:?}");
            assert_eq!(target.kv_pages_free(), Some(1), "seed {seed}: the page back");
            // One page: no two requests' rounds overlap.
            for (i, a) in out.iter().enumerate() {
                for c in &out[i + 1..] {
                    assert!(a.rounds.1 < c.rounds.0 || c.rounds.1 < a.rounds.0, "seed {seed}: {out:?}");
                }
            }
        }

        let mut alone = CudaQwen3::load(g.clone(), &tdir, MAX_LEN).unwrap();
        let mut alone_draft = CudaDraft::load(&ddir, &alone).unwrap();
        for (i, r) in requests.iter().enumerate() {
            if !r.params.is_greedy() {
                // Sampled: its solo run on the device sampler (its own seed, the fixed length).
                let k = VerifyLen::Fixed(fixed.unwrap_or(spec.block_size));
                let solo =
                    speculative_sampled(&mut alone, &mut alone_draft, &r.prompt, &r.opts, &k, &r.params, law, |_| {
                        ControlFlow::Continue(())
                    })
                    .unwrap();
                assert_eq!(out[i].tokens, solo.tokens, "seed {seed}, sampled request {i} ({law:?})");
                continue;
            }
            let plain = greedy(&mut alone, &r.prompt, &r.opts, |_| ControlFlow::Continue(())).unwrap();
            assert_eq!(out[i].tokens, plain.tokens, "seed {seed}, request {i} (prompt {})", r.prompt.len());
            if let Some(k) = fixed {
                let solo = speculative(&mut alone, &mut alone_draft, &r.prompt, &r.opts, &VerifyLen::Fixed(k), |_| {
                    ControlFlow::Continue(())
                })
                .unwrap();
                let rounds = solo.spec.as_ref().map_or(0, |s| s.verified.len());
                assert_eq!(out[i].rounds.1 - out[i].rounds.0, rounds, "seed {seed}, request {i}: rounds");
            }
        }
    }
}

#[test]
fn batched_draft_passes_equal_each_sequence_alone() {
    let kinds = [MarkovKind::Vanilla, MarkovKind::Gated, MarkovKind::Rnn];
    for (i, &kind) in kinds.iter().enumerate() {
        let spec = two_layer_draft(3 + 2 * i, kind, i != 1);
        let (_dir, tdir, ddir) = write_bf16_pair(40 + i as u64, &spec, DType::BF16);
        let target = CudaQwen3::load(gpu(), &tdir, MAX_LEN).unwrap();
        let mut draft = CudaDraft::load(&ddir, &target).unwrap();
        let seqs = 12; // more blocks than one pass holds at B = 7
        draft.reserve_sequences(seqs).unwrap();
        let row = draft.target_layer_ids().len() * target.config().hidden_size;
        let mut drafts = CudaDrafts::new(draft);
        let mut rng = Rng(90 + i as u64);
        let ids: Vec<usize> = (0..seqs).map(|_| drafts.open().unwrap()).collect();
        for round in 0..4 {
            // Every context grows by 1–8 random feature rows, then all propose at once.
            for &id in &ids {
                let n = 1 + rng.below(8);
                let features = rng.vec(n * row);
                drafts.append_captured(id, &dspark_model::Captured::Host(features)).unwrap();
            }
            let items: Vec<(usize, u32)> = ids.iter().map(|&id| (id, rng.below(96) as u32)).collect();
            gpu().set_profiling(round == 0).unwrap();
            let got = drafts.propose_batch(&items).unwrap();
            if round == 0 {
                // A vanilla head's chains run for all requests at once (no one-row Markov
                // launch); the gated and RNN heads' request by request.
                let kernels = gpu().take_profile().unwrap();
                gpu().set_profiling(false).unwrap();
                let one_row: usize =
                    kernels.iter().filter(|k| k.name.contains("argmax_bf16")).map(|k| k.launches).sum();
                match kind {
                    MarkovKind::Vanilla => assert_eq!(one_row, 0, "{kind:?}: {kernels:?}"),
                    _ => assert!(one_row > 0, "{kind:?}: {kernels:?}"),
                }
            }
            for (k, &(id, anchor)) in items.iter().enumerate() {
                let mut alone = None;
                drafts
                    .with_draft(id, &mut |d| {
                        alone = Some(d.propose(anchor)?);
                        Ok(())
                    })
                    .unwrap();
                let alone = alone.unwrap();
                assert_eq!(got[k].tokens, alone.tokens, "{kind:?}, round {round}, sequence {k}: tokens");
                let bits = |s: &Option<Vec<f32>>| s.as_ref().map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                assert_eq!(
                    bits(&got[k].survival),
                    bits(&alone.survival),
                    "{kind:?}, round {round}, sequence {k}: survival"
                );
            }
        }
    }
}

/// The segmented attention launches (`attention_seg.rs`: a step's sequences in one launch per
/// kernel, those of 3 rows or more here — over 4 queries per KV head) against each sequence
/// alone, bit for bit, for both cache element types and with sequences of different lengths
/// and slice counts in one step; a profile shows the segmented kernels ran, once a layer.
#[test]
fn segmented_attention_equals_each_sequence_alone() {
    let (_dir, tdir, _ddir) = write_bf16_pair(5, &two_layer_draft(4, MarkovKind::Vanilla, false), DType::BF16);
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        let seqs = 4;
        let mut batch = CudaBatch::new(CudaQwen3::load_kv(gpu(), &tdir, MAX_LEN, kv).unwrap(), seqs).unwrap();
        let mut solo: Vec<CudaQwen3> =
            (0..seqs).map(|_| CudaQwen3::load_kv(gpu(), &tdir, MAX_LEN, kv).unwrap()).collect();
        let taps = [0usize, 2];
        batch.set_capture(&taps).unwrap();
        for s in &mut solo {
            s.set_capture(&taps).unwrap();
        }
        let vocab = batch.config().vocab_size;
        let layers = batch.config().num_hidden_layers;
        let ids: Vec<usize> = (0..seqs).map(|_| batch.open().unwrap()).collect();
        let mut rng = Rng(97);
        // Prompts of 1 to 60 tokens: 1 to 2 key slices a sequence at first.
        for (s, &id) in ids.iter().enumerate() {
            let prompt: Vec<u32> = (0..1 + rng.below(60)).map(|_| rng.below(vocab) as u32).collect();
            batch.forward_batch(&[(id, &prompt, LogitRows::Last)]).unwrap();
            solo[s].forward(&prompt, LogitRows::Last).unwrap();
        }
        let mut profiled = false;
        for round in 0..12 {
            let items: Vec<(usize, Vec<u32>)> = (0..seqs)
                .filter_map(|s| {
                    let room = MAX_LEN - solo[s].len();
                    let n = (1 + rng.below(9)).min(room);
                    (n > 0).then(|| (s, (0..n).map(|_| rng.below(vocab) as u32).collect()))
                })
                .collect();
            let batch_items: Vec<(usize, &[u32], LogitRows)> =
                items.iter().map(|(s, t)| (ids[*s], t.as_slice(), LogitRows::All)).collect();
            let fits = items.iter().filter(|(_, t)| t.len() >= 3).count();
            let profile = !profiled && fits >= 2;
            if profile {
                gpu().set_profiling(true).unwrap();
            }
            let got = batch.forward_batch_logits(&batch_items, &vec![true; items.len()]).unwrap();
            if profile {
                let kernels = gpu().take_profile().unwrap();
                gpu().set_profiling(false).unwrap();
                let launches = |name: &str| kernels.iter().find(|k| k.name == name).map_or(0, |k| k.launches);
                let sfx = if kv == KvDtype::Bf16 { "_kvbf16" } else { "" };
                assert_eq!(launches(&format!("attention_tc_seg_hd64_f32{sfx}")), layers, "{kv:?}: {kernels:?}");
                assert_eq!(launches("attention_combine_seg_f32"), layers, "{kv:?}: {kernels:?}");
                assert_eq!(launches(&format!("qkv_rope_append_seg_f32{sfx}")), layers, "{kv:?}: {kernels:?}");
                profiled = true;
            }
            for ((s, tokens), (g, logits)) in items.iter().zip(&got) {
                let caps = batch.host_captures(&g.captured).unwrap();
                let alone = solo[*s].forward(tokens, LogitRows::All).unwrap();
                let what = format!("{kv:?} round {round}, sequence {s}, {} rows", tokens.len());
                assert!(same(logits, &alone.logits), "{what}: logits differ from the sequence alone");
                assert!(same(&caps, &alone.captured), "{what}: captures differ from the sequence alone");
            }
            // Roll the longest back now and then, so lengths (and slice counts) keep differing.
            if round % 4 == 3 {
                let s = (0..seqs).max_by_key(|&s| solo[s].len()).unwrap_or(0);
                let keep = rng.below(solo[s].len());
                batch.truncate(ids[s], keep).unwrap();
                solo[s].truncate(keep).unwrap();
            }
        }
        assert!(profiled, "{kv:?}: no step had two sequences for the segmented launch");
    }
}
