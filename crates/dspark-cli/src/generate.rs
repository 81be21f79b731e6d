//! `dspark generate`: the contract later features build on.
//!
//! ```text
//! dspark generate [--target DIR [--draft DIR]] (--prompt TEXT | --prompt-ids 1,2,3) [--chat]
//!                 [--max-tokens N] [--device cpu|cuda] [--json]
//! ```
//!
//! Text mode streams decoded text as tokens are chosen and ends with a stats line on stderr;
//! `--json` prints exactly one JSON object on stdout: `{"tokens", "text", "stats"}`. Without
//! `--target` it runs the demo pair compiled into the binary ([`crate::demo`]).

use crate::demo::{self, EmbeddedModel};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dspark_kernels::KvDtype;
use dspark_model::checkpoint::draft_config::DraftConfig;
use dspark_model::checkpoint::safetensors::Checkpoint;
use dspark_model::checkpoint::tokenizer::{chat_prompt, eos_ids, eos_ids_from, Tokenizer};
use dspark_model::cpu::dspark::{check_tensors, CpuDraft, DraftWeights};
use dspark_model::cpu::qwen3::{CpuQwen3, Qwen3Weights};
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::prefill::PrefillMode;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::cuda::weights::CheckpointUpload;
use dspark_model::{Drafter, Qwen3Config, TargetModel};
use dspark_spec::{greedy, speculative, CostTable, GenerateOptions, Generation, VerifyLen};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    Cpu,
    Cuda,
}

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
    /// Wrap the prompt text in Qwen3's chat template (non-thinking mode).
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
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Where a model's files come from: a folder, or the demo pair compiled into the binary. Both
/// go through the same parsers and checks, and the loaders below make the same calls as
/// `CpuQwen3::load`, `CpuDraft::load`, `CudaQwen3::load_kv` and `CudaDraft::load` do on a
/// folder.
#[derive(Clone, Copy)]
enum Source<'a> {
    Dir(&'a Path),
    Embedded(&'static EmbeddedModel),
}

impl Source<'_> {
    /// The path of one of the model's files, for messages (virtual for the embedded demo).
    fn file(self, name: &str) -> PathBuf {
        match self {
            Source::Dir(d) => d.join(name),
            Source::Embedded(m) => m.file(name),
        }
    }

    fn tokenizer(self) -> dspark_model::Result<Option<Tokenizer>> {
        match self {
            Source::Dir(d) => Tokenizer::from_dir(d),
            Source::Embedded(m) => m.tokenizer(),
        }
    }

    fn target_config(self) -> dspark_model::Result<Qwen3Config> {
        match self {
            Source::Dir(d) => Qwen3Config::from_dir(d),
            Source::Embedded(m) => Qwen3Config::from_json(&m.config_json()?),
        }
    }

    fn draft_config(self) -> dspark_model::Result<DraftConfig> {
        match self {
            Source::Dir(d) => DraftConfig::from_dir(d),
            Source::Embedded(m) => DraftConfig::from_json(&m.config_json()?),
        }
    }

    fn checkpoint(self) -> dspark_model::Result<Checkpoint> {
        match self {
            Source::Dir(d) => Checkpoint::open_dir(d),
            Source::Embedded(m) => m.checkpoint(),
        }
    }

    /// Stop ids from `generation_config.json` (if any) and `config.json`'s.
    fn eos_ids(self, config_eos: &[u32]) -> dspark_model::Result<Vec<u32>> {
        match self {
            Source::Dir(d) => eos_ids(d, config_eos),
            Source::Embedded(m) => eos_ids_from(m.generation_config_json()?.as_ref(), config_eos),
        }
    }
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
            let text = if args.chat { chat_prompt(text) } else { text.clone() };
            tok.encode(&text)?
        }
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    let device = match args.device {
        Some(d) => d,
        None if dspark_kernels::cuda::available() => Device::Cuda,
        None => Device::Cpu,
    };
    if device == Device::Cuda && !dspark_kernels::cuda::available() {
        bail!("--device cuda: no NVIDIA driver (libcuda) or no CUDA device found on this machine; use --device cpu");
    }

    let load_start = Instant::now();
    let cfg = target_src.target_config()?;
    check_context(prompt.len(), args.max_context, cfg.max_position_embeddings)?;
    let (mut target, mut draft): (Box<dyn TargetModel>, Option<Box<dyn Drafter>>) = match device {
        Device::Cpu => {
            let ck = target_src.checkpoint()?;
            let w = Qwen3Weights::load(&cfg, &ck)?;
            drop(ck);
            let t = CpuQwen3::new(cfg, w).with_kv_dtype(args.kv_cache);
            let d = match draft_src {
                Some(src) => {
                    let dcfg = src.draft_config()?;
                    dcfg.validate_against(t.config())?;
                    let ck = src.checkpoint()?;
                    let w = DraftWeights::load(&dcfg, &ck, t.weights())?;
                    Some(Box::new(CpuDraft::new(dcfg, w).with_kv_dtype(args.kv_cache)) as Box<dyn Drafter>)
                }
                None => None,
            };
            (Box::new(t), d)
        }
        Device::Cuda => {
            let gpu = std::sync::Arc::new(dspark_kernels::cuda::Gpu::new(0)?);
            let ck = target_src.checkpoint()?;
            // Weights through pinned staging buffers, after a check that they and the caches fit.
            let reserve = CudaQwen3::planned_bytes(&cfg, args.max_context, args.kv_cache);
            let up =
                CheckpointUpload::new(&ck, &gpu.ctx, reserve)?.with_progress(crate::progress::load_bar(), "target");
            let mut t = CudaQwen3::from_source_kv(gpu, cfg, &up, args.max_context, args.kv_cache)?;
            up.finish()?;
            drop(ck);
            t.set_prefill(args.prefill);
            let d = match draft_src {
                Some(src) => {
                    let dcfg = src.draft_config()?;
                    let ck = src.checkpoint()?;
                    check_tensors(&dcfg, &ck)?;
                    let up =
                        CheckpointUpload::new(&ck, &t.gpu.ctx, 0)?.with_progress(crate::progress::load_bar(), "draft");
                    let d = CudaDraft::from_source(dcfg, &up, &t)?;
                    up.finish()?;
                    Some(Box::new(d) as Box<dyn Drafter>)
                }
                None => None,
            };
            (Box::new(t), d)
        }
    };
    let load = load_start.elapsed();
    let verify_len = match &draft {
        Some(d) => Some(parse_verify_len(args.verify_len.as_deref(), d.block_size(), target.as_mut())?),
        None => None,
    };
    let eos = target_src.eos_ids(&target.config().eos_token_ids)?;
    let opts = GenerateOptions { max_tokens: args.max_tokens, eos_token_ids: eos };

    let mut out = std::io::stdout().lock();
    let mut stream = if args.json { None } else { Some(tokenizer.as_ref().map(|t| t.stream())) };
    let mut failure: Option<anyhow::Error> = None;
    // Text mode prints each token's text as soon as it is complete (ids, space separated, when
    // the model has no tokenizer); JSON mode prints nothing until the end.
    let on_token = |id: u32| {
        let piece = match stream.as_mut() {
            None => return,
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
    };
    let gen = match (&mut draft, &verify_len) {
        (Some(d), Some(v)) => speculative(target.as_mut(), d.as_mut(), &prompt, &opts, v, on_token)?,
        _ => greedy(target.as_mut(), &prompt, &opts, on_token)?,
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
    let dev = match device {
        Device::Cpu => "cpu",
        Device::Cuda => "cuda",
    };
    if args.json {
        let stats = stats_json(&gen, load, dev);
        let _ = writeln!(out, "{}", json!({ "tokens": gen.tokens, "text": text, "stats": stats }));
    } else {
        let _ = writeln!(out);
        eprintln!("{}", stats_line(&gen, load, dev));
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
fn stats_json(g: &Generation, load: Duration, device: &str) -> serde_json::Value {
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

fn stats_line(g: &Generation, load: Duration, device: &str) -> String {
    let spec = match &g.spec {
        Some(s) => format!("; {} rounds, mean accepted length {:.2}", s.rounds(), s.mean_accepted_length()),
        None => String::new(),
    };
    format!(
        "[{} prompt tokens, {} generated, stop: {:?}; load {:.1} ms, prefill {:.1} ms, decode {:.1} tok/s on {device}{spec}]",
        g.prompt_tokens,
        g.tokens.len(),
        g.stop,
        load.as_secs_f64() * 1e3,
        g.prefill.as_secs_f64() * 1e3,
        g.decode_tokens_per_second()
    )
}

/// `--prefill gemm|exact`.
fn parse_prefill(s: &str) -> std::result::Result<PrefillMode, String> {
    match s {
        "gemm" => Ok(PrefillMode::Gemm),
        "exact" => Ok(PrefillMode::Exact),
        _ => Err(format!("--prefill takes gemm or exact, not {s:?}")),
    }
}
