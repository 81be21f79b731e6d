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
use dspark_model::qwen3::CpuQwen3;
use dspark_model::tokenizer::{chat_prompt, eos_ids, Tokenizer};
use dspark_spec::{greedy, GenerateOptions, Generation};
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
    #[arg(long)]
    target: PathBuf,
    /// DSpark draft folder (speculative decoding).
    #[arg(long)]
    draft: Option<PathBuf>,
    /// Prompt text (needs the target folder's tokenizer.json).
    #[arg(long, conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
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
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if args.draft.is_some() {
        bail!("--draft is not supported yet: DSpark speculative decoding is not implemented in this build");
    }
    if args.device == Some(Device::Cuda) {
        bail!("--device cuda is not supported yet: this build has only the CPU reference backend");
    }
    let dir = &args.target;
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
    let mut target = CpuQwen3::load(dir)?;
    let eos = eos_ids(dir, &dspark_model::TargetModel::config(&target).eos_token_ids)?;
    let opts = GenerateOptions { max_tokens: args.max_tokens, eos_token_ids: eos };

    let gen = if args.json {
        greedy(&mut target, &prompt, &opts, |_| {})?
    } else {
        stream_text(&mut target, &prompt, &opts, tokenizer.as_ref())?
    };
    let text = match &tokenizer {
        Some(t) => Some(t.decode(&gen.tokens)?),
        None => None,
    };
    if args.json {
        println!("{}", json!({ "tokens": gen.tokens, "text": text, "stats": stats_json(&gen) }));
    } else {
        eprintln!("{}", stats_line(&gen));
    }
    Ok(())
}

/// Greedy decoding that prints each token's text as soon as it is complete (ids, space
/// separated, when the model has no tokenizer).
fn stream_text(
    target: &mut CpuQwen3,
    prompt: &[u32],
    opts: &GenerateOptions,
    tok: Option<&Tokenizer>,
) -> Result<Generation> {
    let mut out = std::io::stdout().lock();
    let mut stream = tok.map(|t| t.stream());
    let mut failure: Option<anyhow::Error> = None;
    let gen = greedy(target, prompt, opts, |id| {
        let piece = match stream.as_mut() {
            Some(s) => s.push(id).map_err(anyhow::Error::from),
            None => Ok(format!("{id} ")),
        };
        match piece {
            Ok(p) => {
                let _ = out.write_all(p.as_bytes());
                let _ = out.flush();
            }
            Err(e) => failure = failure.take().or(Some(e)),
        }
    })?;
    if let Some(s) = stream.as_mut() {
        let _ = out.write_all(s.finish()?.as_bytes());
    }
    let _ = writeln!(out);
    match failure {
        Some(e) => Err(e),
        None => Ok(gen),
    }
}

fn stats_json(g: &Generation) -> serde_json::Value {
    json!({
        "prompt_tokens": g.prompt_tokens,
        "generated_tokens": g.tokens.len(),
        "stop_reason": g.stop,
        "prefill_ms": g.prefill.as_secs_f64() * 1e3,
        "decode_ms": g.decode.as_secs_f64() * 1e3,
        "tokens_per_second": g.decode_tokens_per_second(),
        "device": "cpu",
    })
}

fn stats_line(g: &Generation) -> String {
    format!(
        "[{} prompt tokens, {} generated, stop: {:?}; prefill {:.1} ms, decode {:.1} tok/s on cpu]",
        g.prompt_tokens,
        g.tokens.len(),
        g.stop,
        g.prefill.as_secs_f64() * 1e3,
        g.decode_tokens_per_second()
    )
}
