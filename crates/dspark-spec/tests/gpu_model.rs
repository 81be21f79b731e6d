//! GPU tier, whole models: the CUDA target and draft against the CPU reference.
//!
//! * prompt logits and captured layers of every fixture target: 1e-4 relative;
//! * 64-token greedy continuations: identical to the CPU's (and the transformers golden);
//! * the golden DSpark runs (every head variant, DFlash, block 4, copy rig, speculators):
//!   identical tokens and accepted lengths;
//! * the lossless property on 100+ random target/draft pairs written to disk: CUDA speculative
//!   == CUDA greedy == CPU greedy;
//! * zero device allocations during decode, verify and draft rounds (arena counter and the
//!   driver's free-memory figure both unchanged);
//! * the device greedy path: on-device argmax == host argmax of the logits, device captures
//!   handed to the draft == host captures, stale capture handles refused;
//! * Qwen3-8B's attention shape (head dim 128, four query heads per KV head) on bf16 pairs:
//!   logits against the CPU, greedy = CPU greedy = speculative (`gpu_model/head_dim_128.rs`).
//! * many requests in one target (`batched.rs`): a batched forward's items = each sequence
//!   alone, bit for bit; batched rounds = each request's solo greedy and solo round count.
//! * a bf16 KV cache against the CPU reference rounded alike, and lossless on it (`kv_bf16.rs`).
//! * bf16 activations: near the f32 reference, lossless, batched = solo (`activations.rs`).
//! * FP8 targets in Qwen's block-scaled layout: logits against the CPU's dequantized reference,
//!   the GEMM prefill, greedy = CPU greedy = speculative (`fp8.rs`).
//! * the memory plan: the embedding in host memory gives the device table's logits bit for bit
//!   and stays lossless; short prefill chunks plan fewer bytes and stay lossless
//!   (`memory_plan.rs`).
//!
//! * row-exact attention: verify rows = decode rows bit for bit, batched = solo on such a GPU
//!   (`row_exact.rs`).
//!
//! * tensor parallel: ranks on one GPU against the CPU reference at N = 1, 2, 4, lossless with a
//!   CPU draft; NCCL over two GPUs where there are two (`tp.rs`).
//!
//! Compiled only with `--features gpu-tests` (`cargo xtask test --gpu`).
#![cfg(feature = "gpu-tests")]

use dspark_kernels::cuda::Gpu;
use dspark_model::checkpoint::draft_config::MarkovKind;
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::testing::{
    random_draft, rel_err, target_config, target_weights, write_draft_dir, write_draft_dir_as, write_target_dir,
    write_target_dir_as, DType, DraftSpec, Rng,
};
use dspark_model::{Drafter, LogitRows, TargetModel};
use dspark_spec::{greedy, speculative, GenerateOptions, VerifyLen};
use serde_json::Value;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The repository root: `DSPARK_ROOT` when the test binary runs from a bundle on another
/// machine, else the source tree it was built from.
fn root() -> PathBuf {
    dspark_model::testing::repo_root()
}

fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| Arc::new(Gpu::new(0).expect("the GPU tier needs a CUDA device"))).clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn golden(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join(format!("fixtures/golden/{name}.json"))).unwrap())
        .unwrap()
}

#[test]
fn fixture_targets_match_the_cpu_reference() {
    // qwen3-tiny-fp8: Qwen's FP8 layout made from qwen3-tiny-bf16 (projections of in 64 take the
    // FP8 tensor-core kernels, down of in 160 too), against transformers on its dequantized weights.
    let names = [
        "qwen3-tiny-f32",
        "qwen3-tiny-sharded",
        "qwen3-tiny-bf16",
        "qwen3-tiny-tied",
        "qwen3-tiny-copy",
        "qwen3-tiny-fp8",
    ];
    for name in names {
        let dir = root().join("fixtures").join(name);
        let g = golden(name);
        let prompt = ids(&g["prompt_ids"]);
        let mut cpu = CpuQwen3::load(&dir).unwrap();
        let mut cuda = CudaQwen3::load(gpu(), &dir, 256).unwrap();
        let layers: Vec<usize> = (0..cpu.config().num_hidden_layers).collect();
        cpu.set_capture(&layers).unwrap();
        cuda.set_capture(&layers).unwrap();
        let a = cpu.forward(&prompt, LogitRows::All).unwrap();
        let b = cuda.forward(&prompt, LogitRows::All).unwrap();
        let e = rel_err(&b.logits, &a.logits);
        assert!(e <= 1e-4, "{name}: logits rel err {e}");
        let e = rel_err(&b.captured, &a.captured);
        assert!(e <= 1e-4, "{name}: captured layers rel err {e}");
        // Verify-shaped forwards after a rollback.
        cpu.truncate(5).unwrap();
        cuda.truncate(5).unwrap();
        let a = cpu.forward(&prompt[..8], LogitRows::All).unwrap();
        let b = cuda.forward(&prompt[..8], LogitRows::All).unwrap();
        assert!(rel_err(&b.logits, &a.logits) <= 1e-4, "{name}: after rollback");

        let opts = GenerateOptions { max_tokens: 64, eos_token_ids: vec![], logprobs: None };
        let want = greedy(&mut cpu, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        let got = greedy(&mut cuda, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        assert_eq!(got, want, "{name}: greedy continuation differs from the CPU");
        if g.get("continuation").is_some() {
            assert_eq!(got, ids(&g["continuation"]), "{name}: greedy continuation differs from transformers");
        }
    }
}

#[test]
fn golden_dspark_runs_on_the_gpu() {
    for name in [
        "dspark-tiny-vanilla",
        "dspark-tiny-gated",
        "dspark-tiny-rnn",
        "dflash-tiny",
        "dspark-tiny-block4",
        "dspark-tiny-copy",
        "dspark-tiny-speculators",
    ] {
        let g = golden(name);
        let target_dir = root().join("fixtures").join(g["target"].as_str().unwrap());
        let mut target = CudaQwen3::load(gpu(), &target_dir, 256).unwrap();
        let mut draft = CudaDraft::load(&root().join("fixtures").join(name), &target).unwrap();
        let opts = GenerateOptions {
            max_tokens: g["max_new_tokens"].as_u64().unwrap() as usize,
            eos_token_ids: ids(&g["eos_token_ids"]),
            logprobs: None,
        };
        let block = draft.block_size();
        let out = speculative(&mut target, &mut draft, &ids(&g["prompt_ids"]), &opts, &VerifyLen::Fixed(block), |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(out.tokens, ids(&g["tokens"]), "{name}: tokens");
        let stats = out.spec.unwrap();
        let want: Vec<usize> =
            ids(&g["accepted_lengths"]).into_iter().zip(&stats.verified).map(|(m, &k)| (m as usize).min(k)).collect();
        assert_eq!(stats.accepted, want, "{name}: accepted lengths");
    }
}

#[test]
fn draft_proposals_match_the_cpu_draft() {
    // Same context, same anchor: the CUDA draft's tokens equal the CPU draft's, round by round.
    let tdir = root().join("fixtures/qwen3-tiny-f32");
    let cpu_t = CpuQwen3::load(&tdir).unwrap();
    let cuda_t = CudaQwen3::load(gpu(), &tdir, 256).unwrap();
    for name in ["dspark-tiny-vanilla", "dspark-tiny-gated", "dspark-tiny-rnn", "dflash-tiny"] {
        let ddir = root().join("fixtures").join(name);
        let mut a = CpuDraft::load(&ddir, cpu_t.config(), cpu_t.weights()).unwrap();
        let mut b = CudaDraft::load(&ddir, &cuda_t).unwrap();
        let row = a.config().num_taps() * 64;
        let mut rng = Rng(9);
        for round in 0..4 {
            let n = [12, 1, 3, 8][round];
            let feats = rng.normal_vec(n * row, 1.0);
            a.append_context(&feats).unwrap();
            b.append_context(&feats).unwrap();
            let anchor = (rng.below(500)) as u32;
            let pa = a.propose(anchor).unwrap();
            let pb = b.propose(anchor).unwrap();
            assert_eq!(pb.tokens, pa.tokens, "{name} round {round}");
            match (pa.survival, pb.survival) {
                (Some(x), Some(y)) => assert!(rel_err(&y, &x) <= 1e-4, "{name} round {round}: survival"),
                (None, None) => {}
                _ => panic!("{name}: confidence head on one backend only"),
            }
        }
    }
}

#[test]
fn a_draft_sharing_the_target_s_matrices_drafts_the_same() {
    // dspark-tiny-vanilla's own embed_tokens / lm_head are byte copies of qwen3-tiny-f32's: the
    // CUDA draft loaded as `dspark generate` loads it uses the target's buffers instead, and
    // proposes what the CPU draft does.
    use dspark_model::checkpoint::draft_config::DraftConfig;
    use dspark_model::checkpoint::safetensors::Checkpoint;
    use dspark_model::checkpoint::shared_heads::SharedHeads;
    use dspark_model::cuda::weights::CheckpointUpload;
    let tdir = root().join("fixtures/qwen3-tiny-f32");
    let ddir = root().join("fixtures/dspark-tiny-vanilla");
    let cpu_t = CpuQwen3::load(&tdir).unwrap();
    let cuda_t = CudaQwen3::load(gpu(), &tdir, 256).unwrap();
    let (ck, tck) = (Checkpoint::open_dir(&ddir).unwrap(), Checkpoint::open_dir(&tdir).unwrap());
    let shared = SharedHeads::find(&ck, &tck, false, [512, 64]);
    assert_eq!(shared.count(), 2);
    let up =
        CheckpointUpload::new_without(&ck, &cuda_t.gpu.ctx, 0, &["embed_tokens.weight", "lm_head.weight"]).unwrap();
    let full = CheckpointUpload::new(&ck, &cuda_t.gpu.ctx, 0).unwrap();
    assert_eq!(full.weight_bytes() - up.weight_bytes(), 2 * 512 * 64 * 4, "the skipped copies' bytes");
    let mut b = CudaDraft::from_source_sharing(DraftConfig::from_dir(&ddir).unwrap(), &up, &cuda_t, shared).unwrap();
    up.finish().unwrap();
    assert_eq!(b.shared_with_target(), 2 * 512 * 64 * 4);
    let mut a = CpuDraft::load(&ddir, cpu_t.config(), cpu_t.weights()).unwrap();
    let row = a.config().num_taps() * 64;
    let mut rng = Rng(17);
    for round in 0..4 {
        let feats = rng.normal_vec([9, 1, 4, 7][round] * row, 1.0);
        a.append_context(&feats).unwrap();
        b.append_context(&feats).unwrap();
        let anchor = rng.below(500) as u32;
        assert_eq!(b.propose(anchor).unwrap().tokens, a.propose(anchor).unwrap().tokens, "round {round}");
    }
}

#[test]
fn lossless_on_random_pairs() {
    let kinds = [MarkovKind::Vanilla, MarkovKind::Gated, MarkovKind::Rnn];
    let mut cases = 0;
    for seed in 0..120u64 {
        let mut rng = Rng(seed * 7919 + 1);
        let vocab = 5 + rng.below(40);
        let layers = 2 + rng.below(2);
        let (heads, kv) = [(2, 1), (2, 2), (4, 2)][rng.below(3)];
        let cfg = target_config(vocab, 32, layers, heads, kv, 32, 96);
        let w = target_weights(seed, &cfg);
        let spec = DraftSpec {
            layers: 1 + rng.below(2),
            block_size: 1 + rng.below(8),
            target_layer_ids: (0..=layers - 2).filter(|l| *l == 0 || rng.below(2) == 1).collect(),
            markov_rank: [0, 4, 8][rng.below(3)],
            markov_kind: kinds[rng.below(3)],
            confidence_head: rng.below(2) == 1,
            confidence_with_markov: rng.below(2) == 1,
        };
        let d = random_draft(seed ^ 0xD5, &cfg, &w, &spec);
        let dir = tempfile::tempdir().unwrap();
        let (tdir, ddir) = (dir.path().join("t"), dir.path().join("d"));
        std::fs::create_dir_all(&tdir).unwrap();
        std::fs::create_dir_all(&ddir).unwrap();
        write_target_dir(&tdir, &cfg, &w).unwrap();
        write_draft_dir(&ddir, d.config(), d.weights()).unwrap();

        let prompt: Vec<u32> = (0..1 + rng.below(10)).map(|_| rng.below(vocab) as u32).collect();
        let opts = GenerateOptions { max_tokens: rng.below(40), eos_token_ids: vec![], logprobs: None };
        let verify = VerifyLen::Fixed(rng.below(9));
        let mut cpu = CpuQwen3::new(cfg.clone(), w.clone());
        let want = greedy(&mut cpu, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        let mut t = CudaQwen3::load(gpu(), &tdir, 96).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let plain = greedy(&mut t, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        let spec_out =
            speculative(&mut t, &mut dr, &prompt, &opts, &verify, |_| ControlFlow::Continue(())).unwrap().tokens;
        assert_eq!(plain, want, "seed {seed}: CUDA greedy != CPU greedy");
        assert_eq!(spec_out, plain, "seed {seed}: CUDA speculative != CUDA greedy");
        // Logprobs put both loops on the host-logits path: the host argmax of the logits is the
        // device argmax (issue 28), and every token reports one.
        let lp_opts = GenerateOptions { logprobs: Some(2), ..opts.clone() };
        let mut reported = 0;
        let mut count = |e: &dspark_spec::Emitted| {
            reported += usize::from(e.logprob.as_ref().is_some_and(|l| l.logprob <= 0.0));
            ControlFlow::Continue(())
        };
        let plain_lp = greedy(&mut t, &prompt, &lp_opts, &mut count).unwrap().tokens;
        let spec_lp = speculative(&mut t, &mut dr, &prompt, &lp_opts, &verify, &mut count).unwrap().tokens;
        assert_eq!(plain_lp, plain, "seed {seed}: CUDA greedy with logprobs");
        assert_eq!(spec_lp, plain, "seed {seed}: CUDA speculative with logprobs");
        assert_eq!(reported, 2 * plain.len(), "seed {seed}: a logprob per token");
        cases += 1;
    }
    assert!(cases >= 100);
}

/// A random bf16 target — hidden 64, 3 layers, q 2 × 64, intermediate 136: every projection's
/// in is a multiple of 8, so the tensor-core paths run — and a draft of `spec` for it in
/// `draft_dtype`, written as HF folders: (the temporary folder, target dir, draft dir).
fn write_bf16_pair(seed: u64, spec: &DraftSpec, draft_dtype: DType) -> (tempfile::TempDir, PathBuf, PathBuf) {
    write_pair(&target_config(96, 64, 3, 2, 1, 64, 128), seed, spec, draft_dtype)
}

/// A two-layer draft tapping target layers 0 and 1, Markov rank 8, with a confidence head (that
/// also reads the Markov term) when `confidence` is set.
fn two_layer_draft(block_size: usize, markov_kind: MarkovKind, confidence: bool) -> DraftSpec {
    DraftSpec {
        layers: 2,
        block_size,
        target_layer_ids: vec![0, 1],
        markov_rank: 8,
        markov_kind,
        confidence_head: confidence,
        confidence_with_markov: confidence,
    }
}

/// CUDA greedy = CPU greedy for `prompt` (a fresh CPU target from `cpu`'s folder is the caller's),
/// and speculative = that greedy on CUDA at each verify length of `ks`; returns the greedy tokens.
fn greedy_and_speculative_agree(
    cpu: &mut CpuQwen3,
    t: &mut CudaQwen3,
    dr: &mut CudaDraft,
    prompt: &[u32],
    opts: &GenerateOptions,
    ks: [usize; 2],
    name: &str,
) -> Vec<u32> {
    let want = greedy(cpu, prompt, opts, |_| ControlFlow::Continue(())).unwrap().tokens;
    let plain = greedy(t, prompt, opts, |_| ControlFlow::Continue(())).unwrap().tokens;
    assert_eq!(plain, want, "{name}: CUDA greedy != CPU greedy");
    for k in ks {
        let out = speculative(t, dr, prompt, opts, &VerifyLen::Fixed(k), |_| ControlFlow::Continue(())).unwrap().tokens;
        assert_eq!(out, plain, "{name}: speculative (verify {k}) != greedy");
    }
    plain
}

/// CUDA logits against the CPU's at 1e-4 for a prompt, then (after rolling both back to half
/// the prompt) a verify-shaped step of `rows` and a decode step of its first token.
fn steps_match_the_cpu(cpu: &mut CpuQwen3, cuda: &mut CudaQwen3, prompt: &[u32], rows: &[u32], name: &str) {
    let a = cpu.forward(prompt, LogitRows::All).unwrap();
    let b = cuda.forward(prompt, LogitRows::All).unwrap();
    assert!(rel_err(&b.logits, &a.logits) <= 1e-4, "{name}: prompt logits {}", rel_err(&b.logits, &a.logits));
    let keep = prompt.len() / 2;
    cpu.truncate(keep).unwrap();
    cuda.truncate(keep).unwrap();
    for (what, step) in [("verify-shaped step", rows), ("one-row step", &rows[..1])] {
        let a = cpu.forward(step, LogitRows::All).unwrap();
        let b = cuda.forward(step, LogitRows::All).unwrap();
        assert!(rel_err(&b.logits, &a.logits) <= 1e-4, "{name}: {what} of {}", step.len());
    }
}

/// A random bf16 target of `cfg` and a draft of `spec` for it, written as HF folders.
fn write_pair(
    cfg: &dspark_model::checkpoint::config::Qwen3Config,
    seed: u64,
    spec: &DraftSpec,
    draft_dtype: DType,
) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let cfg = cfg.clone();
    let w = target_weights(seed, &cfg);
    let d = random_draft(seed ^ 0xD5, &cfg, &w, spec);
    let dir = tempfile::tempdir().unwrap();
    let (tdir, ddir) = (dir.path().join("t"), dir.path().join("d"));
    std::fs::create_dir_all(&tdir).unwrap();
    std::fs::create_dir_all(&ddir).unwrap();
    write_target_dir_as(&tdir, &cfg, &w, DType::BF16).unwrap();
    write_draft_dir_as(&ddir, d.config(), d.weights(), draft_dtype).unwrap();
    (dir, tdir, ddir)
}

#[test]
fn bf16_pairs_match_the_cpu_and_stay_lossless() {
    // bf16 weights with in % 8 == 0 take the tensor-core matvecs, and head_dim 64 with several
    // query rows per KV head (verify, the draft block) the tensor-core attention. Target and
    // draft are written in bf16 and the CPU reference is loaded from the same files, so both run
    // the same rounded weights. The draft cases cover the Markov variants, a confidence head and
    // an f32 draft (general-path layers) on the bf16 target.
    let cases = [
        (MarkovKind::Vanilla, 8, false, DType::BF16),
        (MarkovKind::Gated, 8, true, DType::BF16),
        (MarkovKind::Rnn, 4, false, DType::BF16),
        (MarkovKind::Vanilla, 0, false, DType::F32),
    ];
    for (case, (kind, rank, confidence, draft_dtype)) in cases.into_iter().enumerate() {
        let seed = 1000 + case as u64;
        let mut rng = Rng(seed);
        let spec = DraftSpec {
            layers: 2,
            block_size: 4,
            target_layer_ids: vec![0, 1],
            markov_rank: rank,
            markov_kind: kind,
            confidence_head: confidence,
            confidence_with_markov: confidence,
        };
        let (_dir, tdir, ddir) = write_bf16_pair(seed, &spec, draft_dtype);
        let name = format!("case {case} ({kind:?}, rank {rank}, confidence {confidence}, draft {draft_dtype:?})");

        // Prompt logits and captures (every layer), then a verify-shaped forward after a rollback.
        let mut cpu = CpuQwen3::load(&tdir).unwrap();
        let mut cuda = CudaQwen3::load(gpu(), &tdir, 128).unwrap();
        let prompt: Vec<u32> = (0..11).map(|_| rng.below(96) as u32).collect();
        cpu.set_capture(&[0, 1, 2]).unwrap();
        cuda.set_capture(&[0, 1, 2]).unwrap();
        let a = cpu.forward(&prompt, LogitRows::All).unwrap();
        let b = cuda.forward(&prompt, LogitRows::All).unwrap();
        assert!(rel_err(&b.logits, &a.logits) <= 1e-4, "{name}: logits");
        assert!(rel_err(&b.captured, &a.captured) <= 1e-4, "{name}: captured layers");
        cpu.truncate(4).unwrap();
        cuda.truncate(4).unwrap();
        let a = cpu.forward(&prompt[..7], LogitRows::Last).unwrap();
        let b = cuda.forward(&prompt[..7], LogitRows::Last).unwrap();
        assert!(rel_err(&b.logits, &a.logits) <= 1e-4, "{name}: last-row logits after a rollback");

        // The draft, round by round, against the CPU draft on the same features and anchors.
        let mut cpu_d = CpuDraft::load(&ddir, cpu.config(), cpu.weights()).unwrap();
        let mut cuda_d = CudaDraft::load(&ddir, &cuda).unwrap();
        let row = cpu_d.config().num_taps() * 64;
        for (round, n) in [9, 1, 3, 8].into_iter().enumerate() {
            let feats = rng.normal_vec(n * row, 1.0);
            cpu_d.append_context(&feats).unwrap();
            cuda_d.append_context(&feats).unwrap();
            let anchor = rng.below(96) as u32;
            let (pa, pb) = (cpu_d.propose(anchor).unwrap(), cuda_d.propose(anchor).unwrap());
            assert_eq!(pb.tokens, pa.tokens, "{name} round {round}");
            match (pa.survival, pb.survival) {
                (Some(x), Some(y)) => assert!(rel_err(&y, &x) <= 1e-4, "{name} round {round}: survival"),
                (None, None) => {}
                _ => panic!("{name}: confidence head on one backend only"),
            }
        }

        // Greedy on both backends, and speculative decoding on the GPU: the same tokens.
        let opts = GenerateOptions { max_tokens: 32, eos_token_ids: vec![], logprobs: None };
        let mut cpu = CpuQwen3::load(&tdir).unwrap();
        let mut t = CudaQwen3::load(gpu(), &tdir, 128).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let want = greedy(&mut cpu, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        let plain = greedy(&mut t, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        let spec_out =
            speculative(&mut t, &mut dr, &prompt, &opts, &VerifyLen::Fixed(4), |_| ControlFlow::Continue(()))
                .unwrap()
                .tokens;
        assert_eq!(plain, want, "{name}: CUDA greedy != CPU greedy");
        assert_eq!(spec_out, plain, "{name}: CUDA speculative != CUDA greedy");
    }
}

#[test]
fn decoding_allocates_no_device_memory() {
    let g = golden("dspark-tiny-vanilla");
    let mut target = CudaQwen3::load(gpu(), &root().join("fixtures/qwen3-tiny-f32"), 256).unwrap();
    let mut draft = CudaDraft::load(&root().join("fixtures/dspark-tiny-vanilla"), &target).unwrap();
    let opts = GenerateOptions { max_tokens: 64, eos_token_ids: vec![], logprobs: None };
    // One warm-up generation, then measure a second.
    speculative(&mut target, &mut draft, &ids(&g["prompt_ids"]), &opts, &VerifyLen::Fixed(7), |_| {
        ControlFlow::Continue(())
    })
    .unwrap();
    target.gpu.stream.synchronize().unwrap();
    let (ta, da) = (target.arena.allocations(), draft.arena.allocations());
    let (free_before, _) = cudarc::driver::result::mem_get_info().unwrap();
    let out = speculative(&mut target, &mut draft, &ids(&g["prompt_ids"]), &opts, &VerifyLen::Fixed(7), |_| {
        ControlFlow::Continue(())
    })
    .unwrap();
    greedy(&mut target, &ids(&g["prompt_ids"]), &opts, |_| ControlFlow::Continue(())).unwrap();
    target.gpu.stream.synchronize().unwrap();
    let (free_after, _) = cudarc::driver::result::mem_get_info().unwrap();
    assert!(out.spec.unwrap().rounds() > 10);
    assert_eq!((target.arena.allocations(), draft.arena.allocations()), (ta, da), "arena allocations during decoding");
    assert_eq!(free_after, free_before, "device free memory changed during decoding");
}

#[test]
fn device_greedy_path_and_capture_hand_off() {
    // forward_greedy's on-device argmax equals the argmax of forward's host logits, and the
    // device captures it hands the draft equal the host captures.
    let dir = root().join("fixtures/qwen3-tiny-f32");
    let g = golden("dspark-tiny-vanilla");
    let prompt = ids(&g["prompt_ids"]);
    let mut a = CudaQwen3::load(gpu(), &dir, 256).unwrap();
    let mut b = CudaQwen3::load(gpu(), &dir, 256).unwrap();
    let mut draft_a = CudaDraft::load(&root().join("fixtures/dspark-tiny-vanilla"), &a).unwrap();
    let mut draft_b = CudaDraft::load(&root().join("fixtures/dspark-tiny-vanilla"), &b).unwrap();
    for (t, d) in [(&mut a, &draft_a), (&mut b, &draft_b)] {
        t.set_capture(d.target_layer_ids()).unwrap();
    }
    let vocab = a.config().vocab_size;
    let host = a.forward(&prompt, LogitRows::All).unwrap();
    let dev = b.forward_greedy(&prompt, LogitRows::All).unwrap();
    let want: Vec<u32> =
        (0..host.rows).map(|r| dspark_kernels::cpu::argmax::argmax(host.row(r, vocab)) as u32).collect();
    assert_eq!(dev.ids, want);
    assert!(matches!(dev.captured, dspark_model::Captured::Device(_)), "a short forward keeps its captures on the GPU");
    draft_a.append_context(&host.captured).unwrap();
    draft_b.append_captured(&dev.captured).unwrap();
    assert_eq!(draft_a.propose(want[want.len() - 1]).unwrap(), draft_b.propose(want[want.len() - 1]).unwrap());
    // A handle from before the target's next forward is refused, not read.
    b.forward_greedy(&[want[0]], LogitRows::Last).unwrap();
    let err = draft_b.append_captured(&dev.captured).unwrap_err().to_string();
    assert!(err.contains("stale"), "{err}");

    // Draft tokens left on the GPU are verified without the host and give what verifying the
    // host copy of the same proposal gives; a handle from an earlier proposal is refused.
    let anchor = want[want.len() - 1];
    let older = draft_b.propose_deferred(anchor).unwrap();
    let newer = draft_b.propose_deferred(anchor).unwrap();
    let err = b.verify_greedy(anchor, &older, 2).unwrap_err().to_string();
    assert!(err.contains("stale"), "{err}");
    let len = b.len();
    let on_device = b.verify_greedy(anchor, &newer, 3).unwrap();
    let proposal = draft_b.finish_proposal(newer).unwrap();
    assert!(draft_b.finish_proposal(older).is_err(), "a stale proposal handle was read");
    b.truncate(len).unwrap();
    let mut input = vec![anchor];
    input.extend_from_slice(&proposal.tokens[..3]);
    let on_host = b.forward_greedy(&input, LogitRows::All).unwrap();
    assert_eq!(on_device.ids, on_host.ids, "verify of device draft tokens != verify of their host copy");
}

#[test]
fn graph_replays_match_eager_launches_bit_for_bit() {
    // Two copies of a bf16 pair, one replaying CUDA graphs and one launching eagerly, step by
    // step across the power-of-two key capacities the graphs are keyed on (16, 32, 64, 128):
    // decode and verify logits, device captures and draft proposals must be the same bits.
    let seed = 77;
    let mut rng = Rng(seed);
    let spec = two_layer_draft(4, MarkovKind::Gated, true);
    let (_dir, tdir, ddir) = write_bf16_pair(seed, &spec, DType::BF16);

    let mut graph = CudaQwen3::load(gpu(), &tdir, 200).unwrap();
    let mut eager = CudaQwen3::load(gpu(), &tdir, 200).unwrap();
    let mut graph_d = CudaDraft::load(&ddir, &graph).unwrap();
    let mut eager_d = CudaDraft::load(&ddir, &eager).unwrap();
    graph.set_capture(graph_d.target_layer_ids()).unwrap();
    eager.set_capture(eager_d.target_layer_ids()).unwrap();
    graph.set_graphs(true);
    eager.set_graphs(false);
    graph_d.set_graphs(true);
    eager_d.set_graphs(false);

    let prompt: Vec<u32> = (0..11).map(|_| rng.below(96) as u32).collect();
    let a = graph.forward_greedy(&prompt, LogitRows::Last).unwrap();
    let b = eager.forward_greedy(&prompt, LogitRows::Last).unwrap();
    assert_eq!(a.ids, b.ids);
    graph_d.append_captured(&a.captured).unwrap();
    eager_d.append_captured(&b.captured).unwrap();
    let mut token = a.ids[0];
    while graph.len() < 120 {
        let pos = graph.len();
        // A verify of 5 rows with host logits and captures, rolled back, then one decode step.
        let block: Vec<u32> = (0..5).map(|_| rng.below(96) as u32).collect();
        let (va, vb) = (graph.forward(&block, LogitRows::All).unwrap(), eager.forward(&block, LogitRows::All).unwrap());
        assert_eq!(va.logits, vb.logits, "verify logits at {pos}");
        assert_eq!(va.captured, vb.captured, "verify captures at {pos}");
        graph.truncate(pos).unwrap();
        eager.truncate(pos).unwrap();
        let (ga, gb) = (
            graph.forward_greedy(&[token], LogitRows::Last).unwrap(),
            eager.forward_greedy(&[token], LogitRows::Last).unwrap(),
        );
        assert_eq!(ga.ids, gb.ids, "decode at {pos}");
        graph_d.append_captured(&ga.captured).unwrap();
        eager_d.append_captured(&gb.captured).unwrap();
        let (pa, pb) = (graph_d.propose(token).unwrap(), eager_d.propose(token).unwrap());
        assert_eq!(pa, pb, "proposal at {pos}");
        token = ga.ids[0];
    }
}

#[path = "gpu_model/activations.rs"]
mod activations;

#[path = "gpu_model/batched.rs"]
mod batched;

#[path = "gpu_model/fp8.rs"]
mod fp8;

#[path = "gpu_model/head_dim_128.rs"]
mod head_dim_128;

#[path = "gpu_model/kv_bf16.rs"]
mod kv_bf16;

#[path = "gpu_model/memory_plan.rs"]
mod memory_plan;

#[path = "gpu_model/prefill.rs"]
mod prefill;

#[path = "gpu_model/row_exact.rs"]
mod row_exact;

#[path = "gpu_model/sampled.rs"]
mod sampled;

#[path = "gpu_model/paged.rs"]
mod paged;

#[path = "gpu_model/tp.rs"]
mod tp;
