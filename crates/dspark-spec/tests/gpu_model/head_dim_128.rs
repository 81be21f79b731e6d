//! Qwen3-8B's attention shape on small random bf16 pairs: head dim 128 and four query heads per
//! KV head (32 / 8 in Qwen3-8B), so prefill, verify and the draft block run the tensor-core
//! attention kernel at hd 128 and decode the one-row split kernel at hd 128, each launched
//! with PDL right after `qkv_rope_append_f32` as in the engine, under CUDA graphs. The fixture
//! models are all head dim 64; at hd 128 ptxas had moved attention_tc's query loads above the
//! PDL wait (kernels/common.cuh), which only a whole-model run at this shape could show: the
//! CUDA logits must equal the CPU's (1e-4), and CUDA greedy, CPU greedy and speculative
//! decoding must agree token for token.

use super::*;

#[test]
fn qwen3_8b_attention_shape_matches_the_cpu_and_stays_lossless() {
    // vocab 96, hidden 128, 3 layers, 8 query heads and 2 KV heads of 128.
    let cfg = target_config(96, 128, 3, 8, 2, 128, 160);
    let spec = two_layer_draft(8, MarkovKind::Vanilla, false);
    for seed in 0..6u64 {
        let (_dir, tdir, ddir) = write_pair(&cfg, 7000 + seed, &spec, DType::BF16);
        let mut rng = Rng(seed);
        let prompt: Vec<u32> = (0..1 + rng.below(24)).map(|_| rng.below(96) as u32).collect();
        let name = format!("seed {seed}, prompt of {}", prompt.len());

        let mut cpu = CpuQwen3::load(&tdir).unwrap();
        let mut cuda = CudaQwen3::load(gpu(), &tdir, 160).unwrap();
        // The prompt, then a verify-shaped step of eight rows after a rollback and a decode step.
        let rows: Vec<u32> = (0..8).map(|_| rng.below(96) as u32).collect();
        steps_match_the_cpu(&mut cpu, &mut cuda, &prompt, &rows, &name);

        let opts = GenerateOptions { max_tokens: 24 + rng.below(24), eos_token_ids: vec![], logprobs: None };
        let mut cpu = CpuQwen3::load(&tdir).unwrap();
        let mut t = CudaQwen3::load(gpu(), &tdir, 160).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let ks = [7, 1 + rng.below(7)];
        greedy_and_speculative_agree(&mut cpu, &mut t, &mut dr, &prompt, &opts, ks, &name);
    }
}
