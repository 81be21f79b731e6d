//! `dspark serve`: the OpenAI-compatible server ([`dspark_serve`]) over the models `generate`
//! loads (a folder, or the embedded demo pair without `--target`).
//!
//! ```text
//! dspark serve [--target DIR [--draft DIR]] [--host 127.0.0.1] [--port 8000] [--model-name NAME]
//!              [--device cpu|cuda] [--api-key KEY] [--max-queue N] [--strict-model]
//!              [--max-context N]
//! ```

use crate::demo;
use crate::generate::{load_models, Device, Source};
use anyhow::{Context, Result};
use clap::Args;
use dspark_model::checkpoint::chat_template::ChatTemplate;
use dspark_model::checkpoint::generation_config::SamplingDefaults;
use dspark_serve::{Engine, ServeOptions};
use dspark_spec::{DraftLaw, VerifyLen};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Target model folder (HF Qwen3 layout with tokenizer.json). Default: the embedded demo
    /// coder with its DSpark draft.
    #[arg(long)]
    target: Option<PathBuf>,
    /// DSpark draft folder (speculative decoding).
    #[arg(long, requires = "target")]
    draft: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model id `/v1/models` lists. Default: the target folder's name (`dspark-demo-coder`
    /// for the demo).
    #[arg(long)]
    model_name: Option<String>,
    /// Where to run; defaults to CUDA when a GPU is present, else the CPU.
    #[arg(long, value_enum)]
    device: Option<Device>,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long)]
    api_key: Option<String>,
    /// Requests that may wait for the engine; more answer 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Answer 404 to a request naming another model (default: any name is served).
    #[arg(long)]
    strict_model: bool,
    /// Positions of context per request (prompt + max tokens), capped at max_position_embeddings.
    #[arg(long, default_value_t = 8192)]
    max_context: usize,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let device = crate::generate::resolve_device(args.device)?;
    let model_name = match (&args.model_name, &args.target) {
        (Some(n), _) => n.clone(),
        (None, Some(t)) => t.file_name().map_or("dspark".into(), |n| n.to_string_lossy().into_owned()),
        (None, None) => "dspark-demo-coder".into(),
    };
    let opts = ServeOptions {
        model_name,
        api_key: args.api_key.clone(),
        max_queue: args.max_queue,
        strict_model: args.strict_model,
        max_context: args.max_context,
    };
    let (target, draft, max_context) = (args.target.clone(), args.draft.clone(), args.max_context);
    let load = Box::new(move || -> Result<Engine> {
        let (target_src, draft_src) = match &target {
            Some(dir) => (Source::Dir(dir), draft.as_deref().map(Source::Dir)),
            None => (Source::Embedded(&demo::TARGET), Some(Source::Embedded(&demo::DRAFT))),
        };
        let tokenizer = target_src
            .tokenizer()?
            .with_context(|| format!("serving needs {}", target_src.file("tokenizer.json").display()))?;
        let chat_template = match target_src {
            Source::Dir(d) => ChatTemplate::from_dir(d)?,
            Source::Embedded(_) => ChatTemplate::builtin(),
        };
        let cfg = target_src.target_config()?;
        let defaults = target_src.generation_config()?.map(|g| g.sampling()).unwrap_or(SamplingDefaults::GREEDY);
        let (target, draft) = load_models(
            target_src,
            draft_src,
            cfg,
            device,
            max_context,
            dspark_kernels::KvDtype::F32,
            dspark_model::cuda::prefill::PrefillMode::Gemm,
        )?;
        let eos_token_ids = target_src.eos_ids(&target.config().eos_token_ids)?;
        let verify_len = VerifyLen::Fixed(draft.as_ref().map_or(1, |d| d.block_size()));
        let law = match &draft {
            Some(d) if !d.prefers_sampled_block() => DraftLaw::Greedy,
            _ => DraftLaw::default(),
        };
        Ok(Engine {
            target,
            draft,
            tokenizer: std::sync::Arc::new(tokenizer),
            chat_template: std::sync::Arc::new(chat_template),
            eos_token_ids,
            defaults,
            verify_len,
            law,
        })
    });
    dspark_serve::run(&args.host, args.port, opts, load)
}
