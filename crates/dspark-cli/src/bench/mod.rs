//! `dspark bench`: every phase of DSpark decoding on Qwen3-8B / DSpark-8B shapes, against the
//! HBM floor measured in the same run (ENGINEERING.md §4).
//!
//! The models are the `CudaQwen3` and `CudaDraft` that `dspark generate --device cuda` runs,
//! built from random bf16 weights made on the device ([`RandomWeights`]); every phase is driven
//! through the same trait calls the decoding loops make (`forward_greedy`, `append_captured`,
//! `propose`, `truncate`). Per context length:
//!
//! * `decode`: one plain greedy step (1 token);
//! * `verify8`: one verify forward of 8 tokens;
//! * `draft_round`: appending the committed rows' features (COMMITTED of them, from the
//!   target's device capture buffer) + the block forward, lm_head, Markov chain and confidence;
//! * `round`: what one speculative round costs: draft round + verify of 8 + the host work
//!   between them (choose k, compare, roll back);
//! * `round_sampled`, `round_sampled_t1`: the same round sampled on the device (greedy draft
//!   law, `TargetModel::verify_sampled`) at T 0.7 / top-k 20 / top-p 0.8 and at plain T 1, and
//!   `round_sampled_law` (the sampled draft law, the block drawn on the device,
//!   `Drafter::propose_sampled_device`) at the former — read as a ratio to `round`.
//!
//! Each is timed on the host around the call (median of `--iters`), because that is what a user
//! waits for; the floor is the bytes the phase must stream over the copy ceiling.
//!
//! `--weights bf16,fp8` runs every phase, the prefill and the projections once per target weight
//! format in the same process, against the one ceiling: FP8 is Qwen's block-scaled layout (E4M3
//! bytes, 128 × 128 f32 block scales on the device) with the bf16 draft sharing the target's
//! embeddings and head; its phases and projections carry the suffix `_fp8` and their floors
//! count the FP8 bytes.

mod concurrency;
mod configs;
mod goals;
mod prefill;
mod projections;
pub mod report;
mod tp;

use crate::load::Device;
use anyhow::{bail, Context, Result};
use clap::Args;
use dspark_kernels::cuda::Gpu;
use dspark_kernels::KvDtype;
use dspark_model::backend::Captured;
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::cuda::weights::RandomWeights;
use dspark_model::{Deferred, Drafter, Filters, LogitRows, TargetModel, VerifyOutcome};
use report::{median, model, KernelRow, Phase, Profile, Projection, Report};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Committed rows appended per timed draft round (a mid-range accepted length).
const COMMITTED: usize = 4;
/// Tokens of one verify forward: the anchor + 7 drafts.
const VERIFY: usize = 8;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Context lengths to measure at.
    #[arg(long, value_delimiter = ',', default_value = "512,4096")]
    pub contexts: Vec<usize>,
    /// Timed iterations per phase (after 3 warm-up iterations).
    #[arg(long, default_value_t = 30)]
    pub iters: usize,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seed of the random weights and prompts.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Skip the per-projection cuBLAS comparison.
    #[arg(long)]
    pub no_projections: bool,
    /// Rows of activations in the projection comparison (the draft block is 7).
    #[arg(long, default_value_t = 7)]
    pub projection_rows: usize,
    /// Tuning: only the projection comparison, no model phases.
    #[arg(long)]
    pub projections_only: bool,
    /// Tuning: also time these tensor-core matvec kernels (same signature as matvec_tc_bf16,
    /// e.g. matvec_tc_u4_bf16; `name@ks` forces the K split to 1, 2, 4 or 8) on every projection.
    #[arg(long, value_delimiter = ',')]
    pub matvec_variants: Vec<String>,
    /// Element type of the target's KV cache (as `generate --kv-cache`); the floors count its
    /// bytes at that width.
    #[arg(long, default_value = "f32", value_parser = crate::parse_kv_cache)]
    pub kv_cache: KvDtype,
    /// Timed prefills per prompt length (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub prefill_iters: usize,
    /// Prompt lengths of the prefill phase (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "512,4096,16384")]
    pub prefill: Vec<usize>,
    /// Target weight formats to measure, each with every phase and projection in this run:
    /// `bf16`, `fp8` (Qwen's block-scaled FP8, as `Qwen/Qwen3-8B-FP8` ships).
    #[arg(long, value_delimiter = ',', default_value = "bf16")]
    pub weights: Vec<WeightFormat>,
    /// Latency of one small all-reduce in the tensor-parallel floor model (`tp`), µs: assumed
    /// until a multi-GPU run measures it.
    #[arg(long, default_value_t = 8.0)]
    pub allreduce_us: f64,
    /// Requests per batched round to measure (issue #30, `concurrency.rs`), at each of
    /// `--contexts`; empty: none.
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Tuning: only the batched rounds of `--concurrency`, no other phase.
    #[arg(long)]
    pub concurrency_only: bool,
    /// The batched rounds on paged K/V (`serve --kv-capacity`): pages for the largest level's
    /// requests at each context (A/B against the contiguous caches: the kernels are the same).
    #[arg(long)]
    pub paged: bool,
    /// Where the target's token embedding lives and how many rows a prefill chunk plans (as
    /// `generate`): the memory line reports the device bytes this plan takes.
    /// Precision of the activations of the bf16 projections (as `generate --activations`): the
    /// phases, the projections and the batched rounds all run in it.
    #[arg(long, default_value = "f32", value_parser = crate::parse_activations)]
    pub activations: dspark_kernels::Activations,
    #[command(flatten)]
    pub memory: crate::memory::MemoryArgs,
    /// Also measure the target split over GPUs 0..N (`bench/tp.rs`: Qwen3-8B and 14B shapes,
    /// each phase against the per-GPU floor plus the measured all-reduce), N ≥ 2.
    #[arg(long, value_name = "N")]
    pub tensor_parallel: Option<usize>,
    /// Also print where the target's and the draft's device bytes went: the N source lines
    /// that allocated the most from each arena (`Arena::sites`), as a table to stderr.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub memory_sites: usize,
}

/// A target weight format of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightFormat {
    Bf16,
    Fp8,
}

impl WeightFormat {
    /// What the format's phase, projection and profile names end with (bf16: nothing, so the
    /// bf16 rows read as they always have).
    /// As `--weights` names it.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Fp8 => "fp8",
        }
    }

    pub fn suffix(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "",
            WeightFormat::Fp8 => "_fp8",
        }
    }
}

/// What the model phases of every weight format add to the report.
#[derive(Default)]
struct Measured {
    phases: Vec<Phase>,
    modelled: Vec<report::Modelled>,
    profiles: Vec<Profile>,
    prefill: Vec<report::PrefillRow>,
    memory: Vec<report::MemoryRow>,
    notes: Vec<String>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.contexts.is_empty() || args.iters == 0 {
        bail!("--contexts and --iters must be non-empty / positive");
    }
    let mut gpu = Gpu::new(0).context("dspark bench needs a CUDA GPU")?;
    gpu.set_activations(args.activations)?;
    let gpu = Arc::new(gpu);
    if let Some(n) = args.tensor_parallel {
        // Checked before the other phases run, not after.
        let have = cudarc::driver::CudaContext::device_count().map_or(0, |c| c as usize);
        if n < 2 || n > have {
            bail!("--tensor-parallel {n}: needs 2 to {have} GPUs (this machine has {have})");
        }
    }
    let device = device_name(&gpu);
    if args.projection_rows == 0 || args.projection_rows > 64 {
        bail!("--projection-rows must be 1..=64");
    }
    if args.weights.is_empty() {
        bail!("--weights: name at least one of bf16, fp8");
    }
    let longest = args.contexts.iter().chain(&args.prefill).max().copied().unwrap_or(512);
    let max_ctx = longest + 2 * VERIFY;
    let ceiling = copy_ceiling(&gpu)?;
    eprintln!("bench: {device}; copy ceiling {ceiling:.0} GB/s");
    let mut measured = Measured::default();
    let mut formats = args.weights.clone();
    formats.dedup();
    for &format in formats.iter().filter(|_| !args.projections_only && !args.concurrency_only) {
        measure_model(&args, &gpu, format, max_ctx, ceiling, &mut measured)?;
    }
    let mut batched = Vec::new();
    if args.concurrency.contains(&0) {
        bail!("--concurrency: every level must be at least 1 request");
    }
    let levels = if args.concurrency.is_empty() { &[][..] } else { &formats[..] };
    for &format in levels {
        for &ctx in &args.contexts {
            eprintln!("bench: batched rounds ({format:?}) at {ctx} positions, requests {:?}", args.concurrency);
            let weights = RandomWeights::new(gpu.clone(), args.seed, 0.02);
            let plan = args.memory.plan(Device::Cuda, max_ctx, args.kv_cache)?;
            let tcfg = match format {
                WeightFormat::Bf16 => configs::qwen3_8b()?,
                WeightFormat::Fp8 => configs::qwen3_8b_fp8()?,
            };
            let target = CudaQwen3::from_source_plan(gpu.clone(), tcfg, &weights, plan)?;
            let dw = RandomWeights::new(gpu.clone(), args.seed + 1_000_000, 0.02);
            let draft = CudaDraft::from_source(configs::dspark_8b()?, &dw, &target)?;
            let mut token = tokens(args.seed, target.config().vocab_size);
            let (rows, profiles) = concurrency::measure(
                &gpu,
                target,
                draft,
                (ctx, args.paged, format.name()),
                &args.concurrency,
                args.iters,
                &mut token,
            )?;
            batched.extend(rows);
            measured.profiles.extend(profiles);
        }
    }
    let Measured { phases, modelled, profiles, prefill, memory, notes: model_notes } = measured;

    let mut projs = Vec::new();
    if !args.no_projections {
        let blas = cudarc::cublas::CudaBlas::new(gpu.stream.clone()).context("cuBLAS")?;
        let shapes = [
            ("q_proj", 4096, 4096),
            ("k_proj", 1024, 4096),
            ("v_proj", 1024, 4096),
            ("o_proj", 4096, 4096),
            ("qkv_proj", 6144, 4096),
            ("gate_proj", 12288, 4096),
            ("up_proj", 12288, 4096),
            ("down_proj", 4096, 12288),
            ("fc", 4096, 5 * 4096),
            ("lm_head", 151936, 4096),
            ("markov_w2", 151936, 256),
        ];
        // FP8 targets quantize the decoder's projections only (fc, lm_head and W2 stay bf16).
        let fp8_shapes = |name: &str| !matches!(name, "fc" | "lm_head" | "markov_w2");
        for &format in &formats {
            let fp8 = format == WeightFormat::Fp8;
            for (i, (name, out, inp)) in shapes.into_iter().enumerate().filter(|(_, s)| !fp8 || fp8_shapes(s.0)) {
                let variants: Vec<&str> = args.matvec_variants.iter().map(String::as_str).collect();
                let t = projections::time_projection(
                    &gpu,
                    &blas,
                    (out, inp, args.projection_rows),
                    args.seed + i as u64,
                    &variants,
                    fp8,
                )?;
                let label = format!("{name}{}", format.suffix());
                let mut p =
                    Projection::new(&label, out, inp, args.projection_rows, t.ours.graph, t.cublas.graph, ceiling);
                if fp8 {
                    p.set_weight_bytes((out * inp) as f64, ceiling);
                }
                p.set_eager(t.ours.eager, t.cublas.eager);
                let w = p.weight_bytes;
                p.variants = variants
                    .iter()
                    .zip(t.variants)
                    .map(|(n, us)| (n.to_string(), us, 100.0 * w / (us * 1e3) / ceiling))
                    .collect();
                projs.push(p);
            }
        }
    }

    let report = Report {
        device,
        date_utc: utc_now(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        ceiling_gbps: ceiling,
        phases,
        projections: projs,
        modelled,
        profiles,
        prefill,
        concurrency: batched,
        memory,
        notes: [
            vec![
                format!("KV caches are {} (`--kv-cache`, the draft's alike); floors count them at that width.", args.kv_cache.name()),
                format!("draft_round appends {COMMITTED} committed rows; its floor counts fc, the 5 layers and lm_head once and Markov W2 once per each of the draft's sequential steps."),
                "Phase times are host wall-clock medians around the same calls the decoding loop makes, synchronisation included; projections are CUDA-event means over rotated weight copies, replayed from a CUDA graph of the calls (as generate runs its steps; the goals use these), with the same calls launched one by one from the host beside them (eager: host launch work included wherever the GPU is faster than the host).".into(),
                "Modelled rows assume τ tokens per round; they are not measured acceptance.".into(),
            ],
            model_notes,
        ]
        .concat(),
    };
    print!("{}", report.markdown());
    // Issue #32's floor model at this run's ceiling, largest context and KV width (printed only).
    for (name, cfg) in [("Qwen3-8B", configs::qwen3_8b()?), ("Qwen3-14B", tp::qwen3_14b()?)] {
        let rows = tp::tp_floors(&cfg, max_ctx, args.kv_cache.bytes(), ceiling, args.allreduce_us, &[1, 2, 4, 8])
            .map_err(anyhow::Error::msg)?;
        print!("{}", tp::markdown(name, max_ctx, args.allreduce_us, &rows));
    }
    if let Some(n) = args.tensor_parallel {
        print!(
            "{}",
            tp::measure(n, args.contexts.iter().copied().max().unwrap_or(512), args.kv_cache, ceiling, args.iters)?
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
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
fn measure_model(
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
    if gpu.activations != dspark_kernels::Activations::F32 {
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
    let (phases, modelled, profiles) = (&mut out.phases, &mut out.modelled, &mut out.profiles);
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
fn tokens(seed: u64, vocab: usize) -> impl FnMut() -> u32 {
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

fn profile(gpu: &Gpu, phase: &str, ctx: usize, unprofiled_micros: f64) -> Result<Profile> {
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

/// (bytes read + bytes written) / time of a 4 GiB device-to-device copy, GB/s.
fn copy_ceiling(gpu: &Gpu) -> Result<f64> {
    let n = 1usize << 30; // u32 elements: 4 GiB
    let src = gpu.stream.alloc_zeros::<u32>(n)?;
    let mut dst = gpu.stream.alloc_zeros::<u32>(n)?;
    gpu.stream.memcpy_dtod(&src, &mut dst)?;
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let reps = 5;
    let start = gpu.stream.record_event(flags)?;
    for _ in 0..reps {
        gpu.stream.memcpy_dtod(&src, &mut dst)?;
    }
    let end = gpu.stream.record_event(flags)?;
    let secs = start.elapsed_ms(&end)? as f64 / 1e3;
    Ok((2 * 4 * n * reps) as f64 / secs / 1e9)
}

fn device_name(gpu: &Gpu) -> String {
    let name = gpu.ctx.name().unwrap_or_else(|_| "unknown GPU".into());
    let (a, b) = gpu.compute_capability;
    format!("{name} (sm_{a}{b})")
}

/// `YYYY-MM-DD HH:MM` UTC from the system clock (no date crate needed for one line).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, (rem % 3600) / 60)
}
