//! Target and draft with bf16 KV caches (`--kv-cache bf16`; the draft takes the target's type):
//! the target's logits against the CPU reference with the same rounding
//! (`CpuQwen3::with_kv_dtype`) at the bf16-operand tolerance, 1e-2 — the device and the host may
//! round a key that their f32 chains put on either side of a bf16 rounding boundary differently,
//! by one bf16 step; the option must change the logits (it is not ignored); the draft's
//! proposals equal the CPU draft's rounded alike (`CpuDraft::with_kv_dtype`; such a one-step
//! difference could only flip a near-tie); and speculative decoding on bf16 caches must equal
//! plain greedy decoding on them, token for token, for random bf16 target/draft pairs.

use super::*;
use dspark_kernels::KvDtype;

#[test]
fn bf16_kv_cache_matches_the_cpu_reference_with_the_same_rounding() {
    for name in ["qwen3-tiny-f32", "qwen3-tiny-bf16"] {
        let dir = root().join("fixtures").join(name);
        let prompt = ids(&golden(name)["prompt_ids"]);
        let mut cpu = CpuQwen3::load(&dir).unwrap().with_kv_dtype(KvDtype::Bf16);
        let mut cuda = CudaQwen3::load_kv(gpu(), &dir, 256, KvDtype::Bf16).unwrap();
        let mut cuda_f32 = CudaQwen3::load(gpu(), &dir, 256).unwrap();
        assert_eq!(cuda.kv_dtype(), KvDtype::Bf16);
        let a = cpu.forward(&prompt, LogitRows::All).unwrap();
        let b = cuda.forward(&prompt, LogitRows::All).unwrap();
        let f = cuda_f32.forward(&prompt, LogitRows::All).unwrap();
        let e = rel_err(&b.logits, &a.logits);
        assert!(e <= 1e-2, "{name}: bf16-cache logits rel err {e} against the CPU's");
        assert!(b.logits != f.logits, "{name}: --kv-cache bf16 left the logits unchanged");
        // Decode and verify-shaped steps after a rollback read the cache the prompt wrote.
        cpu.truncate(5).unwrap();
        cuda.truncate(5).unwrap();
        let a = cpu.forward(&prompt[..8], LogitRows::All).unwrap();
        let b = cuda.forward(&prompt[..8], LogitRows::All).unwrap();
        let e = rel_err(&b.logits, &a.logits);
        assert!(e <= 1e-2, "{name}: after rollback {e}");
        let a = cpu.forward(&prompt[8..9], LogitRows::All).unwrap();
        let b = cuda.forward(&prompt[8..9], LogitRows::All).unwrap();
        let e = rel_err(&b.logits, &a.logits);
        assert!(e <= 1e-2, "{name}: one-row step {e}");
    }
}

#[test]
fn draft_proposals_on_bf16_caches_match_the_cpu_draft() {
    let tdir = root().join("fixtures/qwen3-tiny-f32");
    let cpu_t = CpuQwen3::load(&tdir).unwrap();
    let cuda_t = CudaQwen3::load_kv(gpu(), &tdir, 256, KvDtype::Bf16).unwrap();
    for name in ["dspark-tiny-vanilla", "dspark-tiny-rnn"] {
        let ddir = root().join("fixtures").join(name);
        let mut a = CpuDraft::load(&ddir, cpu_t.config(), cpu_t.weights()).unwrap().with_kv_dtype(KvDtype::Bf16);
        let mut b = CudaDraft::load(&ddir, &cuda_t).unwrap();
        let row = a.config().num_taps() * 64;
        let mut rng = Rng(19);
        for round in 0..4 {
            let feats = rng.normal_vec([12, 1, 3, 8][round] * row, 1.0);
            a.append_context(&feats).unwrap();
            b.append_context(&feats).unwrap();
            let anchor = rng.below(500) as u32;
            assert_eq!(b.propose(anchor).unwrap().tokens, a.propose(anchor).unwrap().tokens, "{name} round {round}");
        }
    }
}

#[test]
fn speculative_equals_greedy_on_a_bf16_kv_cache() {
    let spec = two_layer_draft(4, MarkovKind::Vanilla, false);
    for seed in 0..12u64 {
        let (_dir, tdir, ddir) = write_bf16_pair(4000 + seed, &spec, DType::BF16);
        let mut rng = Rng(seed);
        let prompt: Vec<u32> = (0..1 + rng.below(20)).map(|_| rng.below(96) as u32).collect();
        let opts = GenerateOptions { max_tokens: 8 + rng.below(40), eos_token_ids: vec![], logprobs: None };
        let mut t = CudaQwen3::load_kv(gpu(), &tdir, 128, KvDtype::Bf16).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let plain = greedy(&mut t, &prompt, &opts, |_| ControlFlow::Continue(())).unwrap().tokens;
        for verify in [VerifyLen::Fixed(4), VerifyLen::Fixed(1 + rng.below(4))] {
            t.truncate(0).unwrap();
            dr.reset();
            let out =
                speculative(&mut t, &mut dr, &prompt, &opts, &verify, |_| ControlFlow::Continue(())).unwrap().tokens;
            assert_eq!(out, plain, "seed {seed}: speculative on a bf16 cache != greedy on it");
        }
    }
}
