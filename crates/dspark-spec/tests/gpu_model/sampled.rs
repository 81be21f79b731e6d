//! Sampling on the GPU: the CUDA target's device sampler (kernels/sample.cu inside the verify
//! step) against the host rule on the very same logits (`set_device_sampling(false)` sends every
//! row to the host), over whole seeded generations — plain sampled decoding and lossless
//! speculative sampling with the greedy draft law — and the same seed twice on the GPU.
//! The two paths must give the same tokens: the device sampler reproduces the host's
//! arithmetic bit for bit. A vocabulary of 3,000 spans two of the sampler's leaf blocks, and
//! random tiny models are flat enough that top-p alone outgrows the device's candidates, so the
//! host fallback runs too. The first token, drawn from the prefill's last row
//! (`TargetModel::prefill_sampled`), is compared the same way, after decode steps and after the
//! GEMM prefill.
use super::{gpu, two_layer_draft, write_pair};
use dspark_model::checkpoint::draft_config::MarkovKind;
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::testing::{target_config, DType, Rng};
use dspark_spec::{sample, speculative_sampled, DraftLaw, GenerateOptions, SamplingParams, VerifyLen};
use std::ops::ControlFlow;

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, min_p, seed }
}

#[test]
fn device_sampling_equals_the_host_rule() {
    let settings =
        [(1.0, 0, 1.0, 0.0), (0.7, 20, 0.8, 0.0), (0.6, 20, 0.95, 0.0), (1.2, 0, 0.9, 0.0), (0.8, 50, 1.0, 0.1)];
    let mut rounds = 0usize;
    for (case, vocab) in [96usize, 3000].into_iter().enumerate() {
        let seed = 4200 + case as u64;
        let cfg = target_config(vocab, 64, 3, 2, 1, 64, 128);
        let (_dir, tdir, ddir) = write_pair(&cfg, seed, &two_layer_draft(6, MarkovKind::Vanilla, false), DType::BF16);
        let mut t = CudaQwen3::load(gpu(), &tdir, 160).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let mut rng = Rng(seed);
        for (i, &(temp, k, p, mp)) in settings.iter().enumerate() {
            // One prompt per vocabulary takes the GEMM prefill (over 64 tokens), whose last row
            // is sampled on the device too.
            let len = if i == 1 { 80 } else { 3 + rng.below(9) };
            let prompt: Vec<u32> = (0..len).map(|_| rng.below(vocab) as u32).collect();
            let sp = params(temp, k, p, mp, 77 + i as u64);
            let opts = GenerateOptions { max_tokens: 40, eos_token_ids: vec![], logprobs: None };
            let name = format!("V {vocab}, {sp:?}");
            let go = |t: &mut CudaQwen3, dr: &mut CudaDraft, device: bool| {
                t.set_device_sampling(device);
                let plain = sample(t, &prompt, &opts, &sp, |_| ControlFlow::Continue(())).unwrap();
                let spec =
                    speculative_sampled(t, dr, &prompt, &opts, &VerifyLen::Fixed(6), &sp, DraftLaw::Greedy, |_| {
                        ControlFlow::Continue(())
                    })
                    .unwrap();
                (plain.tokens, spec.tokens, spec.spec.map(|s| s.verified.len()))
            };
            let device = go(&mut t, &mut dr, true);
            let again = go(&mut t, &mut dr, true);
            let host = go(&mut t, &mut dr, false);
            assert_eq!(device.0, host.0, "{name}: plain sampling, device != host rule");
            assert_eq!(device.1, host.1, "{name}: speculative sampling, device != host rule");
            assert_eq!(device, again, "{name}: the same seed twice on the GPU");
            assert_eq!(device.0.len(), 40, "{name}: plain sampling stopped early");
            rounds += device.2.unwrap_or(0);
        }
    }
    assert!(rounds > 20, "only {rounds} speculative rounds ran");
}

/// The sampled draft law on the GPU: the CUDA draft draws its block along the Markov chain on
/// the device and the target judges the drafts against the very rows they were drawn from
/// (kernels/sample.cu with q rows) — against the host reference of both (the draft's slot rows
/// copied out and drawn by the CPU sampler, the target's rows judged by the host rule), and the
/// mixed path (a device block judged on the host from the draft rows it hands back). Each
/// Markov variant, two vocabularies (one over two leaf blocks), blocks of 6 and 7, the same seed
/// twice.
#[test]
fn device_sampled_law_equals_the_host_reference() {
    let settings = [(1.0, 0, 1.0, 0.0), (0.7, 20, 0.8, 0.0), (0.6, 20, 0.95, 0.0), (0.8, 50, 1.0, 0.1)];
    let (mut rounds, mut on_device) = (0usize, 0usize);
    // Block 7 is the published draft's (its slots' sampler words then need padding to align).
    for (case, (vocab, markov, block)) in
        [(96usize, MarkovKind::Vanilla, 7), (3000, MarkovKind::Gated, 6), (96, MarkovKind::Rnn, 7)]
            .into_iter()
            .enumerate()
    {
        let seed = 5100 + case as u64;
        let cfg = target_config(vocab, 64, 3, 2, 1, 64, 128);
        let (_dir, tdir, ddir) = write_pair(&cfg, seed, &two_layer_draft(block, markov, true), DType::BF16);
        let mut t = CudaQwen3::load(gpu(), &tdir, 160).unwrap();
        let mut dr = CudaDraft::load(&ddir, &t).unwrap();
        let mut rng = Rng(seed);
        for (i, &(temp, k, p, mp)) in settings.iter().enumerate() {
            let len = 3 + rng.below(9);
            let prompt: Vec<u32> = (0..len).map(|_| rng.below(vocab) as u32).collect();
            let sp = params(temp, k, p, mp, 91 + i as u64);
            let opts = GenerateOptions { max_tokens: 40, eos_token_ids: vec![], logprobs: None };
            let name = format!("V {vocab}, {markov:?}, {sp:?}");
            let go = |t: &mut CudaQwen3, dr: &mut CudaDraft, (draft_dev, target_dev): (bool, bool)| {
                t.set_device_sampling(target_dev);
                dr.set_device_sampling(draft_dev);
                let before = dr.sampled_on_device();
                let g =
                    speculative_sampled(t, dr, &prompt, &opts, &VerifyLen::Fixed(6), &sp, DraftLaw::Sampled, |_| {
                        ControlFlow::Continue(())
                    })
                    .unwrap();
                (g.tokens, g.spec.map(|s| s.verified.len()), dr.sampled_on_device() - before)
            };
            let device = go(&mut t, &mut dr, (true, true));
            let again = go(&mut t, &mut dr, (true, true));
            let host = go(&mut t, &mut dr, (false, false));
            let mixed = go(&mut t, &mut dr, (true, false));
            assert_eq!(device.0, host.0, "{name}: sampled law, device != host reference");
            assert_eq!(mixed.0, host.0, "{name}: device block judged on the host != host reference");
            assert_eq!(device, again, "{name}: the same seed twice on the GPU");
            assert_eq!(host.2, 0, "{name}: the host reference drew on the device");
            assert_eq!(device.0.len(), 40, "{name}: stopped early");
            rounds += device.1.unwrap_or(0);
            on_device += device.2;
        }
    }
    assert!(rounds > 20, "only {rounds} speculative rounds ran");
    assert!(on_device > 10, "only {on_device} blocks were sampled on the device");
}
