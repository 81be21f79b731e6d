//! FP8 targets in Qwen's block-scaled layout (`testing::write_fp8_target_dir`: every projection
//! quantized per block, amax / 448 scales stored as bf16, the rest bf16) on CUDA, against the
//! CPU reference loaded from the same folder (which dequantizes to f32: W8A16).
//!
//! The geometry (hidden 128, q 4 × 32, kv 2 × 32, intermediate 264) sends q|k|v, o and gate|up
//! (in 128) through the FP8 tensor-core matvecs and `down` (in 264, not a multiple of 16)
//! through the general FP8 kernel; blocks 128 × 128 (Qwen's), 16 × 64 and 4 × 4 (general kernel
//! everywhere) each run. Checked:
//! * prompt logits, an eight-row verify-shaped step after a rollback and a decode step: 1e-4
//!   relative, as every f32-exact path;
//! * a 200-token prompt through the GEMM prefill (FP8 weights widened to bf16 for cuBLAS,
//!   activations rounded to bf16): 3e-2, the bf16 checkpoints' bound;
//! * CUDA greedy = CPU greedy after an exact prefill, and speculative = greedy on CUDA (verify 7
//!   and a random length, after a short prompt and after a GEMM prefill), with a bf16 draft
//!   sharing the FP8 target's bf16 embeddings and head.

use super::*;
use dspark_model::cuda::prefill::PrefillMode;
use dspark_model::testing::write_fp8_target_dir;

/// A random FP8 target of `cfg` in `block` blocks and a bf16 draft of `spec` for it, as HF
/// folders.
pub(super) fn write_fp8_pair(
    cfg: &dspark_model::checkpoint::config::Qwen3Config,
    seed: u64,
    block: [usize; 2],
    spec: &DraftSpec,
) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let w = target_weights(seed, cfg);
    let d = random_draft(seed ^ 0xF8, cfg, &w, spec);
    let dir = tempfile::tempdir().unwrap();
    let (tdir, ddir) = (dir.path().join("t"), dir.path().join("d"));
    std::fs::create_dir_all(&tdir).unwrap();
    std::fs::create_dir_all(&ddir).unwrap();
    write_fp8_target_dir(&tdir, cfg, &w, block).unwrap();
    write_draft_dir_as(&ddir, d.config(), d.weights(), DType::BF16).unwrap();
    (dir, tdir, ddir)
}

#[test]
fn fp8_targets_match_the_cpu_and_stay_lossless() {
    let cfg = target_config(300, 128, 3, 4, 2, 32, 512);
    let spec = two_layer_draft(7, MarkovKind::Vanilla, true);
    for (case, block) in [[128, 128], [16, 64], [4, 4]].into_iter().enumerate() {
        let (_dir, tdir, ddir) = write_fp8_pair(&cfg, 8100 + case as u64, block, &spec);
        let mut rng = Rng(case as u64 + 5);
        let name = format!("fp8 blocks {block:?}");
        let prompt: Vec<u32> = (0..3 + rng.below(20)).map(|_| rng.below(300) as u32).collect();

        let mut cpu = CpuQwen3::load(&tdir).unwrap();
        let mut cuda = CudaQwen3::load(gpu(), &tdir, 256).unwrap();
        let rows: Vec<u32> = (0..8).map(|_| rng.below(300) as u32).collect();
        steps_match_the_cpu(&mut cpu, &mut cuda, &prompt, &rows, &name);

        // A long prompt through the GEMM prefill (chunks of 64 rows, so several).
        let long: Vec<u32> = (0..200).map(|_| rng.below(300) as u32).collect();
        let mut cpu = CpuQwen3::load(&tdir).unwrap();
        let mut cuda = CudaQwen3::load(gpu(), &tdir, 256).unwrap();
        cuda.set_prefill_shape(1, 64);
        let a = cpu.forward(&long, LogitRows::All).unwrap();
        let b = cuda.forward(&long, LogitRows::All).unwrap();
        let e = rel_err(&b.logits, &a.logits);
        assert!(e <= 3e-2, "{name}: GEMM prefill logits rel err {e}");

        let opts = GenerateOptions { max_tokens: 32 + rng.below(16), eos_token_ids: vec![], logprobs: None };
        let mut t = CudaQwen3::load(gpu(), &tdir, 256).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let mut cpu = CpuQwen3::load(&tdir).unwrap();
        let ks = [7, 1 + rng.below(7)];
        greedy_and_speculative_agree(&mut cpu, &mut t, &mut dr, &prompt, &opts, ks, &name);
        // After a GEMM prefill: plain and speculative share it, so they still agree.
        t.set_prefill(PrefillMode::Gemm);
        let plain = greedy(&mut t, &long, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        let out = speculative(&mut t, &mut dr, &long, &opts, &VerifyLen::Fixed(7), |_| ControlFlow::Continue(()))
            .unwrap()
            .tokens;
        assert_eq!(out, plain, "{name}: speculative != greedy after a GEMM prefill");
    }
}

/// E4M3 activations (experiment `DSPARK_FP8_A8=1`, `Gpu::fp8_a8`: x quantized per row and
/// 128-wide group, as Qwen and vLLM run FP8 checkpoints; kernels/fp8.cuh): speculative output
/// equals plain greedy output of the same FP8 target in that mode, token for token, at verify 7
/// and a random length. Intermediate 256 sends every projection through the E4M3 kernels (no
/// CPU comparison: the CPU reference computes W8A16).
#[test]
fn fp8_e4m3_activations_stay_lossless() {
    let mut cfg = target_config(300, 128, 3, 4, 2, 32, 512);
    cfg.intermediate_size = 256;
    let spec = two_layer_draft(7, MarkovKind::Vanilla, true);
    let (_dir, tdir, ddir) = write_fp8_pair(&cfg, 8200, [128, 128], &spec);
    let gpu_a8 = {
        let mut g = Gpu::new(0).expect("the GPU tier needs a CUDA device");
        g.fp8_a8 = true;
        Arc::new(g)
    };
    let a8 = || gpu_a8.clone();
    let mut rng = Rng(11);
    for trial in 0..3 {
        let prompt: Vec<u32> = (0..3 + rng.below(20)).map(|_| rng.below(300) as u32).collect();
        let opts = GenerateOptions { max_tokens: 40 + rng.below(16), eos_token_ids: vec![], logprobs: None };
        let mut t = CudaQwen3::load(a8(), &tdir, 256).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let plain = greedy(&mut t, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        for k in [7, 1 + rng.below(7)] {
            let out = speculative(&mut t, &mut dr, &prompt, &opts, &VerifyLen::Fixed(k), |_| ControlFlow::Continue(()))
                .unwrap()
                .tokens;
            assert_eq!(out, plain, "trial {trial}, verify {k}: speculative != greedy with E4M3 activations");
        }
    }
}
