//! `dspark generate`: the contract later features build on.
//!
//! ```text
//! dspark generate [--target DIR [--draft DIR]] (--prompt TEXT | --prompt-ids 1,2,3) [--chat]
//!                 [--max-tokens N] [--device cpu|cuda] [--json]
//!                 [--temperature F] [--top-k N] [--top-p F] [--min-p F] [--seed N]
//!                 [--sampling flags|model]
//! ```
//!
//! Text mode streams decoded text as tokens are chosen and ends with a stats line on stderr;
//! `--json` prints exactly one JSON object on stdout: `{"tokens", "text", "stats"}`. Without
//! `--target` it runs the demo pair compiled into the binary ([`crate::demo`]). Decoding is
//! greedy unless the temperature (from `--temperature`, or with `--sampling model` from the
//! target's `generation_config.json`) is > 0; the stats record the settings and the seed.

use crate::demo;
use crate::load::{load_split, load_typed, resolve_device, Device, Source};
use crate::sampling::{law_name, sampling_params, DraftLawArg, Sampling, SamplingSource};
use anyhow::{bail, Context, Result};
use clap::Args;
use dspark_kernels::KvDtype;
use dspark_model::checkpoint::chat_template::{ChatMessage, ChatTemplate};
use dspark_model::checkpoint::generation_config::SamplingDefaults;
use dspark_model::cuda::prefill::PrefillMode;
use dspark_model::TargetModel;
use dspark_spec::{
    greedy, sample, speculative, speculative_sampled, AcceptanceCheck, CostTable, DraftLaw, Emitted, GenerateOptions,
    Generation, VerifyLen,
};
use serde_json::json;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Target model folder (HF Qwen3 layout: config.json, safetensors, optional tokenizer.json).
    /// Default: the demo coder compiled into the binary (fixtures/coder-target) with its DSpark
    /// draft (fixtures/coder-draft, unless --draft is given).
    #[arg(long)]
    target: Option<PathBuf>,
    /// DSpark draft folder (speculative decoding).
    #[arg(long)]
    draft: Option<PathBuf>,
    /// Prompt text (needs the target folder's tokenizer.json). Default with the demo model: the
    /// start of a Python function.
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt text in the target's chat template (`tokenizer_config.json`; Qwen3's
    /// built-in format without one), non-thinking mode.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Where to run; defaults to CUDA when a GPU is present, else the CPU.
    #[arg(long, value_enum)]
    device: Option<Device>,
    /// Positions of context: the prompt and at least one generated token must fit in it and in
    /// max_position_embeddings; the GPU KV caches are sized for it (capped at
    /// max_position_embeddings).
    #[arg(long, default_value_t = 8192)]
    max_context: usize,
    /// Element type of the target's and the draft's KV caches: f32 (bit for bit the f32 CPU
    /// reference's) or bf16 (half the memory and bytes per position; keys and values rounded
    /// once as stored).
    #[arg(long, default_value = "f32", value_parser = crate::parse_kv_cache)]
    kv_cache: KvDtype,
    /// Drafts to verify per round: a number (capped at the draft's block size), or `auto` to
    /// choose per round from the confidence head and a start-up cost table. Default: the whole
    /// block.
    #[arg(long)]
    verify_len: Option<String>,
    /// How prompts of more than 64 tokens run on the GPU: `gemm` (tensor-core GEMMs and flash
    /// attention, inputs rounded to the weights' dtype) or `exact` (the decode path's f32-exact
    /// small-M kernels, ~30× slower). Decoding is lossless either way.
    #[arg(long, default_value = "gemm", value_parser = parse_prefill)]
    prefill: PrefillMode,
    /// Precision of the activations the GPU's projections take: `f32` (exact: three bf16 parts
    /// a value, the CPU reference's products), `bf16` (bf16 projections round x once, as bf16
    /// engines do; a third of the tensor work, which pays beyond 8 rows a step: `serve
    /// --max-batch`) or `e4m3` (FP8 targets: x quantized to E4M3 per row and 128 values, as
    /// vLLM runs FP8 checkpoints, on E4M3 MMAs; Ada, Hopper or newer). Speculative decoding is
    /// lossless against plain decoding in each. CUDA only.
    #[arg(long, default_value = "f32", value_parser = crate::parse_activations)]
    activations: dspark_kernels::Activations,
    #[command(flatten)]
    memory: crate::memory::MemoryArgs,
    /// Split the target over this many GPUs of the host (tensor parallel over NCCL; needs
    /// --device cuda and --target; a draft runs on GPU 0 with its own embed_tokens / lm_head).
    #[arg(long, default_value_t = 1, value_parser = parse_tensor_parallel)]
    tensor_parallel: usize,
    /// Sampling temperature, finite and ≥ 0. 0 is greedy decoding, bit for bit; with
    /// `--sampling flags` (the default) decoding is greedy unless this is given and > 0.
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub(crate) temperature: Option<f32>,
    /// Keep the N most likely tokens (ties with the N-th kept); 0: off (the default).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) top_k: Option<i64>,
    /// Keep the smallest set of most likely tokens whose probability mass is ≥ F, in (0, 1];
    /// 1: off (the default).
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub(crate) top_p: Option<f32>,
    /// Drop tokens less likely than F times the most likely one, in [0, 1]; 0: off (the
    /// default).
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub(crate) min_p: Option<f32>,
    /// Seed of the sampling draws: the same seed, prompt and settings give the same tokens.
    /// Default: a random seed (from the clock), like llama.cpp's; the seed used is printed in the
    /// stats (`sampling.seed` in --json) so the run can be repeated.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) seed: Option<u64>,
    /// Where settings not given as flags come from: `flags` (greedy, every filter off) or
    /// `model` (the target folder's generation_config.json: do_sample, temperature, top_k,
    /// top_p, min_p; do_sample false or absent, or no file, is greedy). Flags given override the
    /// file's values.
    #[arg(long, value_enum, default_value = "flags")]
    sampling: SamplingSource,
    /// How the draft proposes its block when sampling with a draft: `sampled` (each draft drawn
    /// from the draft's own distribution, kept for the acceptance ratio; the default, measured
    /// the better of the two on the demo coder) or `greedy` (the draft's argmax chain). Either
    /// way the output follows the target's distribution. The CUDA draft defaults to `greedy`
    /// (its sampled block costs 1.04–1.07× a round, no clear gain: docs/perf.md).
    #[arg(long, value_enum)]
    draft_law: Option<DraftLawArg>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

pub fn run(mut args: GenerateArgs) -> Result<()> {
    // No --target: the embedded demo target, its draft unless --draft names one, and the demo
    // prompt unless one is given.
    let (target_src, draft_src) = match &args.target {
        Some(dir) => (Source::Dir(dir), args.draft.as_deref().map(Source::Dir)),
        None => {
            if args.prompt.is_none() && args.prompt_ids.is_none() {
                args.prompt = Some(demo::PROMPT.to_string());
            }
            let draft = args.draft.as_deref().map(Source::Dir).unwrap_or(Source::Embedded(&demo::DRAFT));
            (Source::Embedded(&demo::TARGET), Some(draft))
        }
    };
    if args.verify_len.is_some() && draft_src.is_none() {
        bail!("--verify-len needs --draft");
    }
    if args.draft_law.is_some() && draft_src.is_none() {
        bail!("--draft-law needs --draft");
    }
    // The sampling settings, checked before anything else is read: the flags first (an error
    // names the flag), then generation_config.json's for `--sampling model` (naming the file).
    let model_sampling = match args.sampling {
        SamplingSource::Flags => None,
        SamplingSource::Model => {
            Some(target_src.generation_config()?.map(|g| g.sampling()).unwrap_or(SamplingDefaults::GREEDY))
        }
    };
    let params = sampling_params(&args, model_sampling)?;
    let tokenizer = target_src.tokenizer()?;
    let prompt: Vec<u32> = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let tok = tokenizer.as_ref().with_context(|| {
                format!(
                    "--prompt needs {}; use --prompt-ids for a model without a tokenizer",
                    target_src.file("tokenizer.json").display()
                )
            })?;
            let text = if args.chat {
                let template = match target_src {
                    Source::Dir(d) => ChatTemplate::from_dir(d)?,
                    Source::Embedded(_) => ChatTemplate::builtin(),
                };
                template.render(&[ChatMessage::user(text.as_str())], true, false)?
            } else {
                text.clone()
            };
            tok.encode(&text)?
        }
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    let device = resolve_device(args.device)?;

    let load_start = Instant::now();
    let cfg = target_src.target_config()?;
    check_context(prompt.len(), args.max_context, cfg.max_position_embeddings)?;
    let (mut target, mut draft) = match args.tensor_parallel {
        1 => load_typed(
            target_src,
            draft_src,
            cfg,
            device,
            &args.memory.plans(device, args.max_context, args.kv_cache)?,
            args.prefill,
            args.activations,
        )?
        .boxed(),
        n => load_split(n, target_src, draft_src, device, args.max_context, args.kv_cache, args.activations)?,
    };
    let load = load_start.elapsed();
    let verify_len = match &draft {
        Some(d) => Some(parse_verify_len(args.verify_len.as_deref(), d.block_size(), target.as_mut())?),
        None => None,
    };
    // The draft's law when sampling: dspark_spec's default (sampled) where the draft prefers it
    // (the CPU draft); the CUDA draft, whose sampled block costs more than it gains, and one
    // that cannot sample its block draft their argmax chain unless told otherwise.
    let law = match (&draft, args.draft_law) {
        (Some(d), Some(DraftLawArg::Sampled)) if !params.is_greedy() && !d.can_sample_block() => {
            bail!("--draft-law sampled: the draft on {} cannot sample its block; use --draft-law greedy", device.name())
        }
        (_, Some(l)) => l.into(),
        (Some(d), None) if !d.prefers_sampled_block() => DraftLaw::Greedy,
        _ => DraftLaw::default(),
    };
    let eos = target_src.eos_ids(&target.config().eos_token_ids)?;
    let opts = GenerateOptions { max_tokens: args.max_tokens, eos_token_ids: eos, logprobs: None };

    let mut out = std::io::stdout().lock();
    let mut stream = if args.json { None } else { Some(tokenizer.as_ref().map(|t| t.stream())) };
    let mut failure: Option<anyhow::Error> = None;
    // Text mode prints each token's text as soon as it is complete (ids, space separated, when
    // the model has no tokenizer); JSON mode prints nothing until the end.
    let on_token = |e: &Emitted| {
        let id = e.token;
        let piece = match stream.as_mut() {
            None => return ControlFlow::Continue(()),
            Some(Some(s)) => s.push(id).map_err(anyhow::Error::from),
            Some(None) => Ok(format!("{id} ")),
        };
        match piece {
            Ok(p) => {
                let _ = out.write_all(p.as_bytes());
                let _ = out.flush();
            }
            Err(e) => failure = failure.take().or(Some(e)),
        }
        ControlFlow::Continue(())
    };
    // Temperature 0 takes the greedy loops, as before; > 0 their sampling twins.
    let gen = match (&mut draft, &verify_len) {
        (Some(d), Some(v)) if params.is_greedy() => {
            speculative(target.as_mut(), d.as_mut(), &prompt, &opts, v, on_token)?
        }
        (Some(d), Some(v)) => {
            speculative_sampled(target.as_mut(), d.as_mut(), &prompt, &opts, v, &params, law, on_token)?
        }
        _ if params.is_greedy() => greedy(target.as_mut(), &prompt, &opts, on_token)?,
        _ => sample(target.as_mut(), &prompt, &opts, &params, on_token)?,
    };
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some(Some(s)) = stream.as_mut() {
        let _ = out.write_all(s.finish()?.as_bytes());
    }
    let text = match &tokenizer {
        Some(t) => Some(t.decode(&gen.tokens)?),
        None => None,
    };
    let dev = device.name();
    // Greedy decoding's draft proposes its argmax chain whatever --draft-law says.
    let law = if params.is_greedy() { DraftLaw::Greedy } else { law };
    let sampling = Sampling { source: args.sampling, params, law: draft.as_ref().map(|_| law_name(law)) };
    let shared = draft.as_ref().map_or(0, |d| d.shared_with_target());
    // The start-up check of the draft: a run whose first rounds accept almost nothing says so
    // loudly (the output is exact either way).
    let low = gen.spec.as_ref().and_then(|s| AcceptanceCheck::new().observe(s));
    if let Some(low) = &low {
        eprintln!("warning: {low}");
    }
    if args.json {
        let mut stats = stats_json(&gen, load, dev, shared);
        stats["sampling"] = sampling.json();
        if let Some(low) = &low {
            stats["warnings"] = json!([low.to_string()]);
        }
        let _ = writeln!(out, "{}", json!({ "tokens": gen.tokens, "text": text, "stats": stats }));
    } else {
        let _ = writeln!(out);
        eprintln!("{}", stats_line(&gen, load, dev, &sampling, shared));
    }
    Ok(())
}

/// The prompt and at least one generated token must fit in the context: `--max-context` and the
/// target's `max_position_embeddings`, whichever is smaller. Checked before any weights load.
fn check_context(prompt: usize, max_context: usize, max_positions: usize) -> Result<()> {
    let limit = max_context.min(max_positions);
    if prompt >= limit {
        bail!(
            "prompt of {prompt} tokens leaves no room to generate: the prompt and one generated token must fit in \
             {limit} positions (--max-context {max_context}, max_position_embeddings {max_positions})"
        );
    }
    Ok(())
}

/// `--verify-len`: absent → the whole block; a number; or `auto` (measures the cost table now).
fn parse_verify_len(arg: Option<&str>, block: usize, target: &mut dyn TargetModel) -> Result<VerifyLen> {
    match arg {
        None => Ok(VerifyLen::Fixed(block)),
        Some("auto") => Ok(VerifyLen::Auto(CostTable::measure(target, block + 1, 3)?)),
        Some(n) => n
            .parse::<usize>()
            .map(VerifyLen::Fixed)
            .map_err(|_| anyhow::anyhow!("--verify-len: expected a number or `auto`, got {n:?}")),
    }
}

/// `load` is the wall time from reading the target's config to the draft being ready (device
/// set-up, every check, conversion and upload included; the tokenizer not).
fn stats_json(g: &Generation, load: Duration, device: &str, shared: usize) -> serde_json::Value {
    let mut v = json!({
        "prompt_tokens": g.prompt_tokens,
        "generated_tokens": g.tokens.len(),
        "stop_reason": g.stop,
        "load_ms": load.as_secs_f64() * 1e3,
        "prefill_ms": g.prefill.as_secs_f64() * 1e3,
        "decode_ms": g.decode.as_secs_f64() * 1e3,
        "tokens_per_second": g.decode_tokens_per_second(),
        "device": device,
    });
    if let Some(s) = &g.spec {
        v["draft_shared_bytes"] = json!(shared);
        v["speculative"] = json!({
            "block_size": s.block_size,
            "rounds": s.rounds(),
            "mean_accepted_length": s.mean_accepted_length(),
            "accepted_histogram": s.accepted_histogram(),
            "verified_per_round": s.verified,
            "accepted_per_round": s.accepted,
        });
    }
    v
}

fn stats_line(g: &Generation, load: Duration, device: &str, sampling: &Sampling, shared: usize) -> String {
    let spec = match &g.spec {
        Some(s) => format!("; {} rounds, mean accepted length {:.2}", s.rounds(), s.mean_accepted_length()),
        None => String::new(),
    };
    let spec = match shared {
        0 => spec,
        b => format!("{spec}; the draft shares the target's embeddings/lm_head ({:.1} MB not copied)", b as f64 / 1e6),
    };
    let sampled = sampling.line();
    format!(
        "[{} prompt tokens, {} generated, stop: {:?}; load {:.1} ms, prefill {:.1} ms, decode {:.1} tok/s on {device}{spec}{sampled}]",
        g.prompt_tokens,
        g.tokens.len(),
        g.stop,
        load.as_secs_f64() * 1e3,
        g.prefill.as_secs_f64() * 1e3,
        g.decode_tokens_per_second()
    )
}

/// `--tensor-parallel N`: at least 1.
fn parse_tensor_parallel(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("at least 1 GPU".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("expected a number of GPUs, got {s:?} ({e})")),
    }
}

/// `--prefill gemm|exact`.
pub(crate) fn parse_prefill(s: &str) -> std::result::Result<PrefillMode, String> {
    match s {
        "gemm" => Ok(PrefillMode::Gemm),
        "exact" => Ok(PrefillMode::Exact),
        _ => Err(format!("--prefill takes gemm or exact, not {s:?}")),
    }
}
