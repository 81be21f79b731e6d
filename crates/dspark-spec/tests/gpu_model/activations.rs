//! bf16 activations (`--activations bf16`: the bf16 projections round x once and run one MMA a
//! chunk, the `_x1` kernels), on a `Gpu` of their own:
//!
//! * the logits against the f32 CPU reference at 3e-2 — the bf16-operand tolerance of the GEMM
//!   prefill, since x now loses what bf16 cannot hold (about 2^-9 of each value) before every
//!   projection; and unlike the f32 activations' logits (the option is not ignored);
//! * speculative decoding equals plain greedy decoding in this mode, token for token, for
//!   random bf16 target/draft pairs at several verify lengths;
//! * batched forwards equal each item's sequence alone, and batched rounds of random requests
//!   (wide launches of up to 64 rows) each request's solo runs, in this mode (`batched.rs`'s
//!   tests on this `Gpu`);
//! * a verify step's logits equal its tokens' decode steps' bit for bit: the mode implies
//!   row-exact attention (`Gpu::rows_exact`, `row_exact.rs`);
//! * norm producers storing bf16 rows for their consumers (`Gpu::x_bf16_rows`, the `_x1h`
//!   kernels) and wide launches staging x once per block (`Gpu::wide_split`,
//!   kernels/matvec_split.cu) leave every logit the same bits as f32 rows on matvec.cu's wide
//!   kernels.

use super::*;
use dspark_kernels::Activations;

/// A second handle on the GPU whose bf16 matvecs take bf16 activations.
fn gpu_bf16_activations() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let mut g = Gpu::new(0).expect("the GPU tier needs a CUDA device");
        // The tiny models' grids cover no SMs: take the split kernels anyway.
        g.split_any_grid = true;
        g.set_activations(Activations::Bf16).expect("bf16 activations");
        Arc::new(g)
    })
    .clone()
}

/// The same mode with f32 rows between norm producers and consumers (`x_bf16_rows` off) and
/// matvec.cu's wide kernels (`wide_split` off).
fn gpu_bf16_activations_f32_rows() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let mut g = Gpu::new(0).expect("the GPU tier needs a CUDA device");
        g.x_bf16_rows = false;
        g.wide_split = false;
        g.set_activations(Activations::Bf16).expect("bf16 activations");
        Arc::new(g)
    })
    .clone()
}

#[test]
fn bf16_rows_leave_the_logits_the_same_bits() {
    for name in ["qwen3-tiny-bf16"] {
        let dir = root().join("fixtures").join(name);
        let prompt = ids(&golden(name)["prompt_ids"]);
        let mut rows = CudaQwen3::load(gpu_bf16_activations(), &dir, 256).unwrap();
        let mut f32s = CudaQwen3::load(gpu_bf16_activations_f32_rows(), &dir, 256).unwrap();
        let n = prompt.len();
        assert!(n >= 8, "{name}: a prompt of {n} tokens");
        // The prompt, then a verify-shaped and a one-row step after a rollback.
        let a = rows.forward(&prompt, LogitRows::All).unwrap();
        let b = f32s.forward(&prompt, LogitRows::All).unwrap();
        assert!(a.logits.iter().zip(&b.logits).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}: prompt logits");
        for t in [&mut rows, &mut f32s] {
            t.truncate(n - 7).unwrap();
        }
        for step in [&prompt[n - 7..n - 1], &prompt[n - 1..]] {
            let a = rows.forward(step, LogitRows::All).unwrap();
            let b = f32s.forward(step, LogitRows::All).unwrap();
            assert!(
                a.logits.iter().zip(&b.logits).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}: step of {} rows",
                step.len()
            );
        }
    }
}

#[test]
fn bf16_activations_stay_near_the_f32_reference_and_change_the_logits() {
    let name = "qwen3-tiny-bf16";
    let dir = root().join("fixtures").join(name);
    let prompt = ids(&golden(name)["prompt_ids"]);
    let mut cpu = CpuQwen3::load(&dir).unwrap();
    let mut x1 = CudaQwen3::load(gpu_bf16_activations(), &dir, 256).unwrap();
    let mut f32s = CudaQwen3::load(gpu(), &dir, 256).unwrap();
    let a = cpu.forward(&prompt, LogitRows::All).unwrap();
    let b = x1.forward(&prompt, LogitRows::All).unwrap();
    let f = f32s.forward(&prompt, LogitRows::All).unwrap();
    let e = rel_err(&b.logits, &a.logits);
    assert!(e <= 3e-2, "{name}: bf16-activation logits rel err {e} against the f32 CPU reference");
    assert!(b.logits != f.logits, "{name}: --activations bf16 left the logits unchanged");
    // Verify-shaped and one-row steps after a rollback.
    let n = prompt.len();
    assert!(n >= 8, "{name}: a prompt of {n} tokens");
    for t in [&mut cpu as &mut dyn TargetModel, &mut x1] {
        t.truncate(n - 7).unwrap();
    }
    for step in [&prompt[n - 7..n - 1], &prompt[n - 1..]] {
        let a = cpu.forward(step, LogitRows::All).unwrap();
        let b = x1.forward(step, LogitRows::All).unwrap();
        let e = rel_err(&b.logits, &a.logits);
        assert!(e <= 3e-2, "{name}: step of {} rows, rel err {e}", step.len());
    }
}

#[test]
fn speculative_equals_greedy_with_bf16_activations() {
    let kinds = [MarkovKind::Vanilla, MarkovKind::Gated, MarkovKind::Rnn];
    for seed in 0..9u64 {
        let spec = two_layer_draft(4 + (seed as usize % 4), kinds[seed as usize % 3], seed % 2 == 1);
        let (_dir, tdir, ddir) = write_bf16_pair(7000 + seed, &spec, DType::BF16);
        let mut rng = Rng(seed + 300);
        let prompt: Vec<u32> = (0..1 + rng.below(20)).map(|_| rng.below(96) as u32).collect();
        let opts = GenerateOptions { max_tokens: 8 + rng.below(40), eos_token_ids: vec![], logprobs: None };
        let mut t = CudaQwen3::load(gpu_bf16_activations(), &tdir, 128).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let plain = greedy(&mut t, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        for verify in [VerifyLen::Fixed(spec.block_size), VerifyLen::Fixed(1 + rng.below(spec.block_size))] {
            t.truncate(0).unwrap();
            dr.reset();
            let out =
                speculative(&mut t, &mut dr, &prompt, &opts, &verify, |_| ControlFlow::Continue(())).unwrap().tokens;
            assert_eq!(out, plain, "seed {seed}, {verify:?}: speculative != greedy with bf16 activations");
        }
    }
}

#[test]
fn batched_forwards_equal_each_sequence_alone_with_bf16_activations() {
    super::batched::forward_items_equal_each_sequence_alone(gpu_bf16_activations());
}

#[test]
fn batched_rounds_equal_solo_runs_with_bf16_activations() {
    super::batched::rounds_equal_solo_runs(gpu_bf16_activations(), 100..104);
}

#[test]
fn verify_rows_equal_decode_rows_bit_for_bit_with_bf16_activations() {
    // The mode implies row-exact attention (`Gpu::rows_exact`): without it, a verify row's
    // attention agrees with its decode row's to ~2⁻²², and rounding x to bf16 turned such a
    // difference into another token (a batched request left its solo tokens at seed 103 above).
    let shapes = [target_config(96, 128, 3, 8, 2, 128, 160), target_config(96, 64, 3, 2, 1, 64, 128)];
    for cfg in &shapes {
        for graphs in [true, false] {
            let (equal, steps) = super::row_exact::verify_equals_decode(&gpu_bf16_activations(), cfg, graphs);
            assert_eq!(equal, steps, "hd {}, graphs {graphs}: verify steps unlike their decode steps", cfg.head_dim);
        }
    }
}
