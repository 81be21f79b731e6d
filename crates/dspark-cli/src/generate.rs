//! `dspark generate`: the contract later features build on.
//!
//! ```text
//! dspark generate --target DIR [--draft DIR] (--prompt TEXT | --prompt-ids 1,2,3) [--chat]
//!                 [--max-tokens N] [--device cpu|cuda] [--json]
//! ```
//!
//! Text mode streams decoded text as tokens are chosen and ends with a stats line on stderr;
//! `--json` prints exactly one JSON object on stdout: `{"tokens", "text", "stats"}`.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dspark_kernels::KvDtype;
use dspark_model::checkpoint::tokenizer::{chat_prompt, eos_ids, Tokenizer};
use dspark_model::cpu::dspark::CpuDraft;
use dspark_model::cpu::qwen3::CpuQwen3;
use dspark_model::cuda::dspark::CudaDraft;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::{Drafter, TargetModel};
use dspark_spec::{greedy, speculative, CostTable, GenerateOptions, Generation, VerifyLen};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Target model folder (HF Qwen3 layout: config.json, safetensors, optional tokenizer.json).
    /// Default: the embedded demo coder (fixtures/coder-target) with its DSpark draft.
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
    /// Positions the GPU KV caches are sized for (capped at max_position_embeddings).
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
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// The embedded demo: a tiny Qwen3 trained on Python source and its DSpark draft
/// (train/README.md), used when `--target` is not given.
const DEMO_TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/coder-target");
const DEMO_DRAFT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/coder-draft");
const DEMO_PROMPT: &str = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";

pub fn run(mut args: GenerateArgs) -> Result<()> {
    if args.target.is_none() {
        let target = PathBuf::from(DEMO_TARGET);
        if !target.join("config.json").exists() {
            bail!("no --target given and the embedded demo model is missing at {}", target.display());
        }
        args.target = Some(target);
        if args.draft.is_none() {
            args.draft = Some(PathBuf::from(DEMO_DRAFT));
        }
        if args.prompt.is_none() && args.prompt_ids.is_none() {
            args.prompt = Some(DEMO_PROMPT.to_string());
        }
    }
    if args.verify_len.is_some() && args.draft.is_none() {
        bail!("--verify-len needs --draft");
    }
    let dir = args.target.as_ref().context("--target is required")?;
    let tokenizer = Tokenizer::from_dir(dir)?;
    let prompt: Vec<u32> = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let tok = tokenizer.as_ref().with_context(|| {
                format!(
                    "--prompt needs {}; use --prompt-ids for a model without a tokenizer",
                    dir.join("tokenizer.json").display()
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
    let (mut target, mut draft): (Box<dyn TargetModel>, Option<Box<dyn Drafter>>) = match device {
        Device::Cpu => {
            let t = CpuQwen3::load(dir)?.with_kv_dtype(args.kv_cache);
            let d = match &args.draft {
                Some(d) => Some(Box::new(CpuDraft::load(d, t.config(), t.weights())?.with_kv_dtype(args.kv_cache))
                    as Box<dyn Drafter>),
                None => None,
            };
            (Box::new(t), d)
        }
        Device::Cuda => {
            if !dspark_kernels::cuda::available() {
                bail!("--device cuda: no NVIDIA driver (libcuda) or no CUDA device found on this machine; use --device cpu");
            }
            let gpu = std::sync::Arc::new(dspark_kernels::cuda::Gpu::new(0)?);
            let t = CudaQwen3::load_kv(gpu, dir, args.max_context, args.kv_cache)?;
            let d = match &args.draft {
                Some(d) => Some(Box::new(CudaDraft::load(d, &t)?) as Box<dyn Drafter>),
                None => None,
            };
            (Box::new(t), d)
        }
    };
    let verify_len = match &draft {
        Some(d) => Some(parse_verify_len(args.verify_len.as_deref(), d.block_size(), target.as_mut())?),
        None => None,
    };
    let eos = eos_ids(dir, &target.config().eos_token_ids)?;
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
        let _ = writeln!(out, "{}", json!({ "tokens": gen.tokens, "text": text, "stats": stats_json(&gen, dev) }));
    } else {
        let _ = writeln!(out);
        eprintln!("{}", stats_line(&gen, dev));
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

fn stats_json(g: &Generation, device: &str) -> serde_json::Value {
    let mut v = json!({
        "prompt_tokens": g.prompt_tokens,
        "generated_tokens": g.tokens.len(),
        "stop_reason": g.stop,
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

fn stats_line(g: &Generation, device: &str) -> String {
    let spec = match &g.spec {
        Some(s) => format!("; {} rounds, mean accepted length {:.2}", s.rounds(), s.mean_accepted_length()),
        None => String::new(),
    };
    format!(
        "[{} prompt tokens, {} generated, stop: {:?}; prefill {:.1} ms, decode {:.1} tok/s on {device}{spec}]",
        g.prompt_tokens,
        g.tokens.len(),
        g.stop,
        g.prefill.as_secs_f64() * 1e3,
        g.decode_tokens_per_second()
    )
}
