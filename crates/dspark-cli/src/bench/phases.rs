//! The model phases of `dspark bench` for one weight format: the target and draft built from
//! random weights, then decode, the verify of 8, the draft round and the rounds (greedy and
//! sampled) timed at each context, each profiled kernel by kernel, and the prefill. Times are host
//! wall-clock medians around the calls the decoding loops make, because that is what a user
//! waits for; the module docs of `bench` list the phases.

use super::report::{self, median, model, KernelRow, Phase, Profile};
use super::{configs, prefill, trace, BenchArgs, WeightFormat, COMMITTED, VERIFY};
use crate::load::Device;
use anyhow::{bail, Result};
use dspark_kernels::cuda::Gpu;
use dspark_model::backend::Captured;
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::cuda::weights::RandomWeights;
use dspark_model::{Deferred, Drafter, Filters, LogitRows, TargetModel, VerifyOutcome};
use std::sync::Arc;
use std::time::Instant;

/// What the model phases of every weight format add to the report.
#[derive(Default)]
pub(super) struct Measured {
    pub phases: Vec<Phase>,
    pub modelled: Vec<report::Modelled>,
    pub profiles: Vec<Profile>,
    pub prefill: Vec<report::PrefillRow>,
    pub memory: Vec<report::MemoryRow>,
    pub notes: Vec<String>,
    /// `--trace`: each phase's in-graph table (bench/trace.rs), as markdown.
    pub traces: Vec<String>,
}

/// The `n` source lines that took the most of `arena`, as a markdown table, and the rest summed.
fn memory_sites(what: &str, arena: &dspark_tensor::arena::Arena, n: usize) -> String {
    let sites = arena.sites();
    let mut s = format!(
        "\n{what}: {:.3} GB in {} allocations\n\n| MB | allocations | at |\n|---:|---:|---|\n",
        arena.bytes() as f64 / 1e9,
        arena.allocations()
    );
    for site in sites.iter().take(n) {
        s += &format!("| {:.1} | {} | {} |\n", site.bytes as f64 / 1e6, site.allocations, site.at);
    }
    let rest: usize = sites.iter().skip(n).map(|x| x.bytes).sum();
    s += &format!(
        "| {:.1} | {} | (the other lines) |\n",
        rest as f64 / 1e6,
        sites.iter().skip(n).map(|x| x.allocations).sum::<usize>()
    );
    s
}

/// Every model phase of one weight format (see the module docs): builds the target and draft,
/// times decode, verify, the draft round and the rounds at each context, profiles them, and the
/// prefill.
pub(super) fn measure_model(
    args: &BenchArgs,
    gpu: &Arc<Gpu>,
    format: WeightFormat,
    max_ctx: usize,
    ceiling: f64,
    out: &mut Measured,
) -> Result<()> {
    let sfx = format.suffix();
    let n = |name: &str| format!("{name}{sfx}");
    eprintln!("bench: building Qwen3-8B ({format:?}) + DSpark-8B with random weights");
    let tcfg = match format {
        WeightFormat::Bf16 => configs::qwen3_8b()?,
        WeightFormat::Fp8 => configs::qwen3_8b_fp8()?,
    };
    let dcfg = configs::dspark_8b()?;
    if max_ctx > tcfg.max_position_embeddings {
        bail!("--contexts: {max_ctx} positions exceed max_position_embeddings {}", tcfg.max_position_embeddings);
    }
    let weights = RandomWeights::new(gpu.clone(), args.seed, 0.02);
    let plan = args.memory.plan(Device::Cuda, max_ctx, args.kv_cache)?;
    // What a card must hold: the process's device memory in use (the context, its modules and
    // handles included), beside the arenas' own count.
    let in_use = || gpu.ctx.mem_get_info().map(|(free, total)| total.saturating_sub(free));
    // Freed buffers (the copy ceiling's 8 GiB) return to the driver at a synchronisation.
    gpu.stream.synchronize()?;
    let before = in_use()?;
    let mut target = CudaQwen3::from_source_plan(gpu.clone(), tcfg, &weights, plan)?;
    let mut draft =
        CudaDraft::from_source(dcfg, &RandomWeights::new(gpu.clone(), args.seed + 1_000_000, 0.02), &target)?;
    target.set_capture(draft.target_layer_ids())?;
    gpu.stream.synchronize()?;
    let after = in_use()?;
    if gpu.activations == dspark_kernels::Activations::E4m3 {
        out.notes.push(
            "--activations e4m3: the FP8 projections quantize x to E4M3 per row and 128 values (W8A8, as vLLM runs FP8 checkpoints) on E4M3 tensor cores; bf16 matrices keep f32 x; attention row-exact.".into(),
        );
    } else if gpu.activations != dspark_kernels::Activations::F32 {
        let path = match (&gpu.row_gemm, target.runs_on_row_gemms()) {
            (Some(_), true) => "the layers' projections and lm_head on cuBLASLt row GEMMs (row_gemm.rs)",
            (Some(_), false) => "the layers on the matvec kernels (a shape could not be planned on cuBLASLt)",
            (None, _) => "the matvec kernels (no cuBLASLt, or DSPARK_NO_ROW_GEMM)",
        };
        out.notes.push(format!(
            "--activations {}: every bf16 projection rounds its x once; {path}.",
            gpu.activations.name()
        ));
    }
    out.notes.push(format!(
        "{format:?}: device memory in use by this process (cuMemGetInfo, total − free): {:.2} GB before the models were built, {:.2} GB after ({:.3} GiB).",
        before as f64 / 1e9,
        after as f64 / 1e9,
        after as f64 / (1u64 << 30) as f64,
    ));
    out.notes.push(format!(
        "{format:?}: target {:.2} GB + draft {:.2} GB of device memory (weights, {} KV caches for {max_ctx} positions, buffers; --embeddings {} ({:.2} GB in host memory), prefill chunks of {} rows; draft_shared_bytes {:.2} GB), {:.2} GB of target weights streamed per forward.",
        target.arena.bytes() as f64 / 1e9,
        draft.arena.bytes() as f64 / 1e9,
        target.kv_dtype().name(),
        plan.embeddings.name(),
        (target.host_bytes() + draft.host_bytes()) as f64 / 1e9,
        target.prefill_rows(),
        draft.shared_with_target() as f64 / 1e9,
        target.streamed_weight_bytes() as f64 / 1e9,
    ));
    out.memory.push(report::MemoryRow {
        weights: format.name().into(),
        ctx: target.max_len(),
        kv: target.kv_dtype().name().into(),
        target_gb: target.arena.bytes() as f64 / 1e9,
        draft_gb: draft.arena.bytes() as f64 / 1e9,
    });
    if args.memory_sites > 0 {
        eprint!("{}", memory_sites(&format!("{format:?} target"), &target.arena, args.memory_sites));
        eprint!("{}", memory_sites("draft", &draft.arena, args.memory_sites));
    }
    let (phases, modelled, profiles, traces) = (&mut out.phases, &mut out.modelled, &mut out.profiles, &mut out.traces);
    let mut token = tokens(args.seed, target.config().vocab_size);

    let tb = target.streamed_weight_bytes() as f64;
    let tcfg = target.config().clone();
    // K and V per position at the caches' width (the draft's take the target's, `--kv-cache`).
    let kv_bytes = target.kv_dtype().bytes();
    let t_kv = (tcfg.num_hidden_layers * 2 * tcfg.kv_dim() * kv_bytes) as f64;
    let (fc, dlayers, lm_head, w2) = draft.matrix_bytes();
    let dl = &draft.config().layer;
    let d_kv = (dl.num_hidden_layers * 2 * dl.kv_dim() * kv_bytes) as f64;
    let block = draft.block_size();
    let logits_row = (tcfg.vocab_size * 4) as f64;

    for &ctx in args.contexts.iter() {
        eprintln!("bench: prefill {ctx} tokens");
        target.truncate(0)?;
        draft.reset();
        let prompt: Vec<u32> = (0..ctx).map(|_| token()).collect();
        let f = target.forward_greedy(&prompt, LogitRows::Last)?;
        draft.append_captured(&f.captured)?;
        let anchor = f.ids[0];
        let verify: Vec<u32> = (0..VERIFY).map(|_| token()).collect();

        let decode = time(args.iters, || {
            target.forward_greedy(&[anchor], LogitRows::Last)?;
            target.truncate(ctx)?;
            Ok(())
        })?;
        let decode_bytes = tb + t_kv * (ctx + 2) as f64 + 2.0 * logits_row;
        phases.push(Phase::new(&n("decode"), ctx, decode, decode_bytes, ceiling));

        let verify_us = time(args.iters, || {
            target.forward_greedy(&verify, LogitRows::All)?;
            target.truncate(ctx)?;
            Ok(())
        })?;
        let verify_bytes = tb + t_kv * (ctx + 2 * VERIFY) as f64 + 2.0 * VERIFY as f64 * logits_row;
        phases.push(Phase::new(&n("verify8"), ctx, verify_us, verify_bytes, ceiling));

        // Committed rows for the draft come from a verify forward's device captures.
        let pending = target.forward_greedy(&verify, LogitRows::All)?.captured.prefix(COMMITTED, 0);
        target.truncate(ctx)?;
        if !matches!(pending, Captured::Device(_)) {
            bail!("the verify forward's captures did not stay on the device");
        }
        let draft_us = time(args.iters, || {
            draft.append_captured(&pending)?;
            draft.propose(anchor)?;
            draft.truncate_context(ctx)?;
            Ok(())
        })?;
        let dctx = (ctx + COMMITTED + block) as f64;
        let draft_bytes = (fc + dlayers + lm_head + block * w2) as f64 + d_kv * dctx + 2.0 * block as f64 * logits_row;
        phases.push(Phase::new(&n("draft_round"), ctx, draft_us, draft_bytes, ceiling));

        // A whole round as the loop runs it with a fixed verify length: append, propose (the
        // tokens stay on the GPU), verify, read the proposal, compare, roll back.
        let mut pending = pending;
        let round_us = time(args.iters, || {
            draft.append_captured(&pending)?;
            let deferred = draft.propose_deferred(anchor)?;
            let g = target.verify_greedy(anchor, &deferred, block)?;
            let proposal = draft.finish_proposal(deferred)?;
            let m = (0..block).take_while(|&i| proposal.tokens[i] == g.ids[i]).count();
            std::hint::black_box(m);
            pending = g.captured.prefix(COMMITTED, 0);
            target.truncate(ctx)?;
            draft.truncate_context(ctx)?;
            Ok(())
        })?;
        phases.push(Phase::new(&n("round"), ctx, round_us, draft_bytes + verify_bytes, ceiling));
        // The same round sampled on the device: under the greedy draft law (the argmax chain,
        // one-hot q) at Qwen's recommended filters and at plain temperature 1, and under the
        // sampled law (the block drawn along the Markov chain on the device, each draft judged
        // against the row it was drawn from). Judge: the ratio to `round` above (same verify
        // length).
        let uniforms: Vec<f64> = (0..=block).map(|i| (i as f64 + 0.5) / (block + 1) as f64).collect();
        let chain: Vec<f64> = (0..block).map(|i| (i as f64 + 0.25) / block as f64).collect();
        let qwen = Filters { temperature: 0.7, top_k: 20, top_p: 0.8, min_p: 0.0 };
        let t1 = Filters { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0 };
        let mut sampled_rounds = Vec::new();
        for (name, filters, sampled_law) in
            [("round_sampled", qwen, false), ("round_sampled_t1", t1, false), ("round_sampled_law", qwen, true)]
        {
            let mut sampled_round = || -> dspark_model::Result<()> {
                let fell_back =
                    |what: &str| dspark_model::Error::Request(format!("{name}: the {what} fell back to the host"));
                draft.append_captured(&pending)?;
                let deferred = if sampled_law {
                    let ds =
                        draft.propose_sampled_device(anchor, &filters, &chain)?.ok_or_else(|| fell_back("draft"))?;
                    Deferred::OnDevice(ds.tokens)
                } else {
                    draft.propose_deferred(anchor)?
                };
                let v = target.verify_sampled(anchor, &deferred, block, &filters, &uniforms)?;
                if !matches!(v.outcome, VerifyOutcome::Drawn { .. }) {
                    return Err(fell_back("verify's sampler"));
                }
                draft.finish_proposal(deferred)?;
                pending = v.captured.prefix(COMMITTED, 0);
                target.truncate(ctx)?;
                draft.truncate_context(ctx)?;
                Ok(())
            };
            let us = time(args.iters, &mut sampled_round)?;
            phases.push(Phase::new(&n(name), ctx, us, draft_bytes + verify_bytes, ceiling));
            if name != "round_sampled_t1" {
                sampled_rounds.push((name, filters, sampled_law, us));
            }
        }
        for tau in [2.0, 3.0, 4.0, 5.0, 6.0] {
            modelled.push(model(ctx, tau, round_us, decode));
        }

        // Profiles: one decode step, one verify, and one draft round fed by that verify's
        // captures, with per-launch events.
        gpu.set_profiling(true)?;
        target.forward_greedy(&[anchor], LogitRows::Last)?;
        target.truncate(ctx)?;
        profiles.push(profile(gpu, &n("decode"), ctx, decode)?);
        let pending = target.forward_greedy(&verify, LogitRows::All)?.captured.prefix(COMMITTED, 0);
        target.truncate(ctx)?;
        profiles.push(profile(gpu, &n("verify8"), ctx, verify_us)?);
        draft.append_captured(&pending)?;
        draft.propose(anchor)?;
        draft.truncate_context(ctx)?;
        profiles.push(profile(gpu, &n("draft_round"), ctx, draft_us)?);
        // And the two sampled rounds at Qwen's filters (where the sampler's launches go).
        for (name, filters, sampled_law, us) in sampled_rounds {
            let pending = target.forward_greedy(&verify, LogitRows::All)?.captured.prefix(COMMITTED, 0);
            target.truncate(ctx)?;
            gpu.take_profile()?; // that verify is not part of the round
            draft.append_captured(&pending)?;
            let deferred = match sampled_law {
                true => match draft.propose_sampled_device(anchor, &filters, &chain)? {
                    Some(ds) => Deferred::OnDevice(ds.tokens),
                    None => bail!("{name}: the draft fell back to the host while profiled"),
                },
                false => draft.propose_deferred(anchor)?,
            };
            target.verify_sampled(anchor, &deferred, block, &filters, &uniforms)?;
            draft.finish_proposal(deferred)?;
            target.truncate(ctx)?;
            draft.truncate_context(ctx)?;
            profiles.push(profile(gpu, &n(name), ctx, us)?);
        }
        gpu.set_profiling(false)?;

        if args.trace {
            eprintln!("bench: tracing decode, verify8 and draft_round at {ctx} keys");
            for (phase, us) in [("decode", decode), ("verify8", verify_us), ("draft_round", draft_us)] {
                // The draft round appends the committed rows of a verify's captures, as timed
                // above: taken after the target's traced phases, whose forwards make older
                // captures stale (the draft refuses them).
                let pending = match phase {
                    "draft_round" => {
                        let p = target.forward_greedy(&verify, LogitRows::All)?.captured.prefix(COMMITTED, 0);
                        target.truncate(ctx)?;
                        Some(p)
                    }
                    _ => None,
                };
                let mut step = |t: &mut CudaQwen3, d: &mut CudaDraft| -> dspark_model::Result<()> {
                    match (phase, &pending) {
                        (_, Some(p)) => {
                            d.append_captured(p)?;
                            d.propose(anchor)?;
                            return d.truncate_context(ctx);
                        }
                        ("decode", None) => t.forward_greedy(&[anchor], LogitRows::Last).map(drop)?,
                        _ => t.forward_greedy(&verify, LogitRows::All).map(drop)?,
                    }
                    t.truncate(ctx)
                };
                traces.push(trace::trace_phase((&n(phase), ctx, us), gpu, &mut target, &mut draft, &mut step)?);
            }
        }
    }
    if !args.prefill.is_empty() {
        let rows = prefill::measure(
            gpu,
            &mut target,
            &mut draft,
            &args.prefill,
            args.prefill_iters,
            &mut token,
            sfx,
            profiles,
        )?;
        out.prefill.extend(rows);
    }
    Ok(())
}

/// Random token ids below `vocab` (xorshift from `seed`): the bench's prompts and drafts.
pub(super) fn tokens(seed: u64, vocab: usize) -> impl FnMut() -> u32 {
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % vocab as u64) as u32
    }
}

/// Median µs of `iters` calls after 3 warm-up calls.
fn time(iters: usize, mut f: impl FnMut() -> dspark_model::Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    let mut xs = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        xs.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&mut xs))
}

pub(super) fn profile(gpu: &Gpu, phase: &str, ctx: usize, unprofiled_micros: f64) -> Result<Profile> {
    let kernels: Vec<KernelRow> = gpu
        .take_profile()?
        .into_iter()
        .map(|k| KernelRow { name: k.name, launches: k.launches, micros: k.micros })
        .collect();
    Ok(Profile {
        phase: phase.into(),
        ctx,
        kernel_micros: kernels.iter().map(|k| k.micros).sum(),
        unprofiled_micros,
        kernels,
    })
}
