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
mod phases;
mod prefill;
mod projections;
pub mod report;
mod tp;
mod trace;

use crate::load::Device;
use anyhow::{bail, Context, Result};
use clap::Args;
use dspark_kernels::cuda::Gpu;
use dspark_kernels::KvDtype;
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::cuda::weights::RandomWeights;
use dspark_model::TargetModel;
use phases::{measure_model, profile, tokens, Measured};
use report::{median, Projection, Report};
use std::path::PathBuf;
use std::sync::Arc;

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
    /// Precision of the projections' activations (as `generate --activations`: f32, bf16, or
    /// e4m3 for the FP8 weights): the phases, the projections and the batched rounds all run in it.
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
    /// Also trace decode, verify8 and draft_round as replayed, kernel by kernel on the device's
    /// clock (bench/trace.rs); needs the trace build: `cargo xtask ptx --trace`, then
    /// `DSPARK_PTX_DIR=target/ptx-trace`.
    #[arg(long)]
    pub trace: bool,
}

/// A target weight format of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightFormat {
    Bf16,
    Fp8,
}

impl WeightFormat {
    /// As `--weights` names it.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Fp8 => "fp8",
        }
    }

    /// What the format's phase, projection and profile names end with (bf16: nothing, so the
    /// bf16 rows read as they always have).
    pub fn suffix(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "",
            WeightFormat::Fp8 => "_fp8",
        }
    }
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
    let Measured { phases, modelled, profiles, prefill, memory, notes: model_notes, traces } = measured;

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
        traces,
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
    // The kernels' build, where `DSPARK_PTX` took an older one than the GPU's own.
    let native = dspark_kernels::cuda::PtxTarget::pick(gpu.compute_capability, None).ok();
    let build = if native == Some(gpu.ptx) { String::new() } else { format!(", {} kernels", gpu.ptx.name()) };
    format!("{name} (sm_{a}{b}{build})")
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
