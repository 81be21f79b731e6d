//! Tensor parallel on CUDA (`cuda::tp::CudaQwen3Tp`), before a multi-GPU machine is lent: the
//! ranks share one GPU and all-reduce through `SameDevice` (a rank-order sum, as the CPU
//! reference `CpuQwen3Tp` adds). Checked, on random bf16 targets (8 query heads over 4 KV heads,
//! so N = 1, 2, 4 split them) and the f32 fixture:
//! * logits of a prompt, an eight-row step after a rollback and a decode step against the CPU
//!   reference at the same N: 1e-4 relative, as every CUDA path against the CPU; and the N = 1
//!   split step against the single-GPU target `CudaQwen3` (which folds its norms into the
//!   matvec epilogues: the same math in another order) at 1e-4;
//! * 48 greedy tokens = the CPU reference's at the same N, and = `CudaQwen3`'s on the fixture;
//! * lossless: speculative decoding with a CPU draft on the split target = its greedy output;
//! * captures of the tapped layers against `CudaQwen3`'s: 1e-4;
//! * the CUDA draft on rank 0's GPU (`draft_host`): speculative = greedy = the single-GPU
//!   target's greedy.
//!
//! Two or more GPUs (NCCL): `nccl_ranks_match_one_device` (ignored unless asked for, where
//! `scripts/gpu-tier.sh` sees at least two GPUs).

use super::*;
use dspark_kernels::KvDtype;
use dspark_model::cpu::tp::CpuQwen3Tp;
use dspark_model::cuda::tp::CudaQwen3Tp;

fn ranks_on_one_gpu(n: usize) -> Vec<Arc<Gpu>> {
    let g = gpu();
    (0..n).map(|_| g.clone()).collect()
}

/// Logits of `a` and `b` within 1e-4 over a prompt, an 8-row step after a rollback, one row.
fn steps_agree(a: &mut dyn TargetModel, b: &mut dyn TargetModel, rng: &mut Rng, vocab: usize, name: &str) {
    let prompt: Vec<u32> = (0..5 + rng.below(60)).map(|_| rng.below(vocab) as u32).collect();
    let rows: Vec<u32> = (0..8).map(|_| rng.below(vocab) as u32).collect();
    let keep = prompt.len() / 2;
    for (what, tokens, truncate) in
        [("prompt", &prompt[..], None), ("8-row step", &rows[..], Some(keep)), ("decode", &rows[..1], None)]
    {
        if let Some(k) = truncate {
            a.truncate(k).unwrap();
            b.truncate(k).unwrap();
        }
        let (fa, fb) = (a.forward(tokens, LogitRows::All).unwrap(), b.forward(tokens, LogitRows::All).unwrap());
        assert_eq!(fa.rows, fb.rows, "{name}: {what}");
        assert!(fb.logits.iter().all(|x| x.is_finite()), "{name}: {what}: non-finite logits");
        let e = rel_err(&fb.logits, &fa.logits);
        assert!(e <= 1e-4, "{name}: {what}: logits rel err {e}");
        if !fa.captured.is_empty() {
            let e = rel_err(&fb.captured, &fa.captured);
            assert!(e <= 1e-4, "{name}: {what}: captures rel err {e}");
        }
    }
}

#[test]
fn split_targets_match_the_cpu_reference_and_stay_lossless() {
    let cfg = target_config(300, 128, 3, 8, 4, 32, 512);
    let spec = two_layer_draft(7, MarkovKind::Vanilla, true);
    let (_dir, tdir, ddir) = write_pair(&cfg, 9500, &spec, DType::BF16);
    let w = CpuQwen3::load(&tdir).unwrap().weights().clone();
    let opts = GenerateOptions { max_tokens: 48, eos_token_ids: vec![], logprobs: None };
    let mut rng = Rng(95);
    for n in [1, 2, 4] {
        let name = format!("N = {n} on one GPU");
        let mut cuda = CudaQwen3Tp::load(ranks_on_one_gpu(n), &tdir, 256, KvDtype::F32).unwrap();
        assert_eq!((cuda.ranks(), cuda.collective()), (n, "same-device"));
        let mut cpu = CpuQwen3Tp::new(cfg.clone(), &w, n, KvDtype::F32).unwrap();
        steps_agree(&mut cpu, &mut cuda, &mut rng, 300, &name);
        if n == 1 {
            // The split step against the single-GPU target, captures included.
            let mut one = CudaQwen3::load(gpu(), &tdir, 256).unwrap();
            let mut split = CudaQwen3Tp::load(ranks_on_one_gpu(1), &tdir, 256, KvDtype::F32).unwrap();
            one.set_capture(&[0, 2]).unwrap();
            split.set_capture(&[0, 2]).unwrap();
            steps_agree(&mut one, &mut split, &mut rng, 300, "N = 1 against CudaQwen3");
        }
        let prompt: Vec<u32> = (0..3 + rng.below(20)).map(|_| rng.below(300) as u32).collect();
        let mut cpu = CpuQwen3Tp::new(cfg.clone(), &w, n, KvDtype::F32).unwrap();
        let mut cuda = CudaQwen3Tp::load(ranks_on_one_gpu(n), &tdir, 256, KvDtype::F32).unwrap();
        let want = greedy(&mut cpu, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        let plain = greedy(&mut cuda, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        assert_eq!(plain, want, "{name}: greedy != the CPU reference's");
        let mut dr = CpuDraft::load(&ddir, &cfg, &w).unwrap();
        let out = speculative(&mut cuda, &mut dr, &prompt, &opts, &VerifyLen::Fixed(7), |_| ControlFlow::Continue(()))
            .unwrap()
            .tokens;
        assert_eq!(out, plain, "{name}: speculative != greedy");
    }
    // The f32 fixture (2 KV heads): N = 2 decodes what the single-GPU target decodes.
    let dir = root().join("fixtures/qwen3-tiny-f32");
    let prompt = [1u32, 5, 9, 2, 7];
    let mut one = CudaQwen3::load(gpu(), &dir, 256).unwrap();
    let mut two = CudaQwen3Tp::load(ranks_on_one_gpu(2), &dir, 256, KvDtype::F32).unwrap();
    let want = greedy(&mut one, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
    let got = greedy(&mut two, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
    assert_eq!(got, want, "fixture: N = 2 greedy != the single-GPU target's");
    // What N does not divide is refused, naming the flag.
    let e = CudaQwen3Tp::load(ranks_on_one_gpu(3), &dir, 256, KvDtype::F32).err().expect("N = 3").to_string();
    assert!(e.contains("--tensor-parallel 3"), "{e}");
}

/// A copy of the draft folder `ddir` carrying the target's `embed_tokens` and `lm_head` as its
/// own, as a published DSpark draft does: a split target lends none.
pub(super) fn draft_with_heads(
    ddir: &std::path::Path,
    tdir: &std::path::Path,
    v: usize,
    h: usize,
) -> tempfile::TempDir {
    use dspark_model::checkpoint::safetensors::{serialize, Checkpoint};
    let out = tempfile::tempdir().unwrap();
    std::fs::copy(ddir.join("config.json"), out.path().join("config.json")).unwrap();
    let (dck, tck) = (Checkpoint::open_dir(ddir).unwrap(), Checkpoint::open_dir(tdir).unwrap());
    let mut t: Vec<(String, DType, Vec<usize>, Vec<u8>)> = dck
        .tensors
        .iter()
        .map(|(n, info)| {
            let (dt, b) = dck.raw(n, &info.shape).unwrap();
            (n.clone(), dt, info.shape.clone(), b.to_vec())
        })
        .collect();
    for (mine, theirs) in [("embed_tokens.weight", "model.embed_tokens.weight"), ("lm_head.weight", "lm_head.weight")] {
        let (dt, b) = tck.raw(theirs, &[v, h]).unwrap();
        t.push((mine.into(), dt, vec![v, h], b.to_vec()));
    }
    let refs: Vec<(&str, DType, Vec<usize>, Vec<u8>)> =
        t.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
    std::fs::write(out.path().join("model.safetensors"), serialize(&refs)).unwrap();
    out
}

/// The CUDA draft on rank 0's GPU of a split target (`CudaQwen3Tp::draft_host`): its proposals
/// read back from that GPU by the target's verify, its captures from the host; speculative =
/// the split target's greedy = the single-GPU target's greedy with the same draft, at N = 2 and
/// 4 on one GPU. A draft without its own heads is refused, naming the tensor.
#[test]
fn cuda_drafts_run_on_split_targets_losslessly() {
    use dspark_model::checkpoint::draft_config::DraftConfig;
    use dspark_model::checkpoint::safetensors::Checkpoint;
    use dspark_model::checkpoint::shared_heads::SharedHeads;
    let cfg = target_config(300, 128, 3, 8, 4, 32, 512);
    let spec = two_layer_draft(7, MarkovKind::Vanilla, true);
    let (_dir, tdir, ddir) = write_pair(&cfg, 9700, &spec, DType::BF16);
    let own = draft_with_heads(&ddir, &tdir, 300, 128);
    let opts = GenerateOptions { max_tokens: 40, eos_token_ids: vec![], logprobs: None };
    let mut rng = Rng(97);
    let prompt: Vec<u32> = (0..3 + rng.below(60)).map(|_| rng.below(300) as u32).collect();
    let mut one = CudaQwen3::load(gpu(), &tdir, 256).unwrap();
    let want = greedy(&mut one, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
    for n in [2, 4] {
        let mut t = CudaQwen3Tp::load(ranks_on_one_gpu(n), &tdir, 256, KvDtype::F32).unwrap();
        let plain = greedy(&mut t, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        assert_eq!(plain, want, "N = {n}: split greedy != single-GPU greedy");
        let host = t.draft_host().unwrap();
        let ck = Checkpoint::open_dir(own.path()).unwrap();
        let mut dr =
            CudaDraft::from_host(DraftConfig::from_dir(own.path()).unwrap(), &ck, &host, SharedHeads::default())
                .unwrap();
        for k in [7, 1 + rng.below(7)] {
            let out = speculative(&mut t, &mut dr, &prompt, &opts, &VerifyLen::Fixed(k), |_| ControlFlow::Continue(()))
                .unwrap()
                .tokens;
            assert_eq!(out, plain, "N = {n}: CUDA-draft speculative (verify {k}) != greedy");
        }
        let bare = Checkpoint::open_dir(&ddir).unwrap();
        let e = CudaDraft::from_host(DraftConfig::from_dir(&ddir).unwrap(), &bare, &host, SharedHeads::default())
            .err()
            .expect("a draft without heads on a split target")
            .to_string();
        assert!(e.contains("embed_tokens.weight") && e.contains("--tensor-parallel"), "{e}");
    }
}

/// NCCL across two GPUs: the same logits as the ranks on one GPU (1e-5: only the order of the
/// all-reduce's sums differs) and the same greedy tokens.
#[test]
#[ignore = "needs two GPUs and libnccl.so: scripts/gpu-tier.sh runs it where nvidia-smi lists two"]
fn nccl_ranks_match_one_device() {
    let cfg = target_config(300, 128, 3, 8, 4, 32, 512);
    let spec = two_layer_draft(7, MarkovKind::Vanilla, true);
    let (_dir, tdir, _ddir) = write_pair(&cfg, 9600, &spec, DType::BF16);
    let two = vec![gpu(), Arc::new(Gpu::new(1).expect("a second GPU"))];
    let mut nccl = CudaQwen3Tp::load(two, &tdir, 256, KvDtype::F32).unwrap();
    assert_eq!(nccl.collective(), "nccl");
    let mut same = CudaQwen3Tp::load(ranks_on_one_gpu(2), &tdir, 256, KvDtype::F32).unwrap();
    let mut rng = Rng(96);
    steps_agree(&mut same, &mut nccl, &mut rng, 300, "NCCL against one device");
    let opts = GenerateOptions { max_tokens: 48, eos_token_ids: vec![], logprobs: None };
    let prompt = [3u32, 1, 4, 1, 5, 9, 2, 6];
    same.truncate(0).unwrap();
    nccl.truncate(0).unwrap();
    let want = greedy(&mut same, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
    let got = greedy(&mut nccl, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
    assert_eq!(got, want, "NCCL greedy != one device's");
}
