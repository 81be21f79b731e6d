//! `dspark serve`: the OpenAI-compatible server ([`dspark_serve`]) over the models `generate`
//! loads (a folder, or the embedded demo pair without `--target`).
//!
//! ```text
//! dspark serve [--target DIR [--draft DIR]] [--host 127.0.0.1] [--port 8000] [--model-name NAME]
//!              [--device cpu|cuda] [--api-key KEY] [--max-queue N] [--strict-model]
//!              [--max-context N] [--max-batch R] [--kv-capacity TOKENS] [--kv-cache f32|bf16]
//! ```
//!
//! `--kv-capacity` plans the K/V caches of all requests as one pool of pages
//! (`dspark_model::kv_pages`, 16 positions a page) when the models load; a request is admitted
//! when its prompt + max_tokens fits in the pages the running ones have not reserved (TGI's
//! `max_batch_total_tokens`), and waits in the queue otherwise.

use crate::demo;
use crate::load::{load_typed, Device, Loaded, Source};
use anyhow::{Context, Result};
use clap::Args;
use dspark_model::checkpoint::chat_template::ChatTemplate;
use dspark_model::checkpoint::generation_config::SamplingDefaults;
use dspark_model::cuda::prefill::PrefillMode;
use dspark_model::{BatchDrafter, BatchTarget, Sequences};
use dspark_serve::{Engine, Models, ServeOptions};
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
    /// Greedy requests decoded together in each speculative round (continuous batching; needs a
    /// draft). Each takes K/V caches of --max-context positions, planned at start-up. 1: one
    /// request at a time.
    #[arg(long, default_value_t = 1)]
    max_batch: usize,
    /// KV positions all requests hold together, planned at start-up in pages of 16 positions
    /// (target and draft): a request runs once its prompt + max_tokens fits beside the running
    /// ones', and waits in the queue until then. Also caps one request's context. Default: each
    /// of --max-batch requests may hold --max-context. On CUDA the pages are the driver's mapping
    /// granularity (2 MiB of a layer's keys or values: 1,024 positions of Qwen3-8B in bf16), mapped
    /// into each request's address range as it grows, for the draft's contexts as well.
    #[arg(long, value_parser = parse_kv_capacity)]
    kv_capacity: Option<usize>,
    /// Element type of the KV caches (`bf16` halves them: what transformers, vLLM and llama.cpp
    /// keep for a bf16 model; `f32` keeps the CPU reference's bits).
    #[arg(long, default_value = "f32", value_parser = crate::parse_kv_cache)]
    kv_cache: dspark_kernels::KvDtype,
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
}

pub fn run(args: ServeArgs) -> Result<()> {
    if args.max_batch == 0 {
        anyhow::bail!("--max-batch: at least 1 request");
    }
    if args.max_batch > 1 && args.target.is_some() && args.draft.is_none() {
        anyhow::bail!("--max-batch {}: batched rounds need a draft (--draft DIR)", args.max_batch);
    }
    let device = crate::load::resolve_device(args.device)?;
    // The memory flags are checked now, before the port is bound (the plan is made again, with
    // the model's config, when it loads).
    args.memory.plan(device, args.max_context, args.kv_cache)?;
    let model_name = match (&args.model_name, &args.target) {
        (Some(n), _) => n.clone(),
        (None, Some(t)) => t.file_name().map_or("dspark".into(), |n| n.to_string_lossy().into_owned()),
        (None, None) => "dspark-demo-coder".into(),
    };
    // One request holds at most the whole capacity, so no cache (or address range) is longer.
    let max_context = args.kv_capacity.map_or(args.max_context, |c| c.min(args.max_context));
    let opts = ServeOptions {
        model_name,
        api_key: args.api_key.clone(),
        max_queue: args.max_queue,
        strict_model: args.strict_model,
        max_context,
    };
    let (target, draft, max_batch, kv_cache, kv_capacity) =
        (args.target.clone(), args.draft.clone(), args.max_batch, args.kv_cache, args.kv_capacity);
    let (memory, activations) = (args.memory, args.activations);
    crate::load::check_activations(device, activations)?;
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
        if max_batch > 1 && draft_src.is_none() {
            anyhow::bail!("--max-batch {max_batch}: batched rounds need a draft (--draft)");
        }
        let plans = memory.plans(device, max_context, kv_cache)?;
        let loaded = load_typed(target_src, draft_src, cfg, device, &plans, PrefillMode::Gemm, activations)?;
        let loaded = match kv_capacity {
            Some(cap) => loaded.with_kv_capacity(cap)?,
            None => loaded,
        };
        let (eos_token_ids, models, block, prefers_sampled) = match loaded.boxed_or_batched(max_batch, kv_capacity)? {
            Built::Solo(target, draft) => {
                let eos = target_src.eos_ids(&target.config().eos_token_ids)?;
                let block = draft.as_ref().map(|d| d.block_size());
                let sampled = draft.as_ref().is_some_and(|d| d.prefers_sampled_block());
                (eos, Models::Solo { target, draft }, block, sampled)
            }
            Built::Batched(target, draft, sampled) => {
                let eos = target_src.eos_ids(&target.config().eos_token_ids)?;
                let block = Some(draft.block_size());
                (eos, Models::Batched { target, draft, max_batch }, block, sampled)
            }
        };
        let verify_len = VerifyLen::Fixed(block.unwrap_or(1));
        let law = match block {
            Some(_) if !prefers_sampled => DraftLaw::Greedy,
            _ => DraftLaw::default(),
        };
        Ok(Engine {
            models,
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

/// The models as the engine takes them.
enum Built {
    Solo(Box<dyn dspark_model::TargetModel>, Option<Box<dyn dspark_model::Drafter>>),
    /// Target, draft, and whether the draft prefers sampled blocks.
    Batched(Box<dyn BatchTarget>, Box<dyn BatchDrafter>, bool),
}

/// `--kv-capacity TOKENS`: at least one position.
fn parse_kv_capacity(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("at least 1 position".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("expected a number of token positions, got {s:?} ({e})")),
    }
}

impl Loaded {
    /// The models with their K/V in one bounded pool of pages for `capacity` positions
    /// (`--kv-capacity`), planned now; reports the pool on stderr.
    fn with_kv_capacity(self, capacity: usize) -> Result<Loaded> {
        use dspark_model::kv_pages::DEFAULT_PAGE;
        let pages = capacity.div_ceil(DEFAULT_PAGE);
        match self {
            Loaded::Cpu(t, d) => {
                let t = t.with_kv_pages(DEFAULT_PAGE, pages).context("--kv-capacity: the target's K/V pages")?;
                let d = d
                    .map(|d| d.with_kv_pages(DEFAULT_PAGE, pages))
                    .transpose()
                    .context("--kv-capacity: the draft's context pages")?;
                let mib = |b: usize| b as f64 / (1 << 20) as f64;
                let draft = d.as_ref().map_or(String::new(), |d| format!(" + draft {:.1} MiB", mib(d.kv_bytes())));
                eprintln!(
                    "dspark serve: K/V cache of {} positions: {pages} pages of {DEFAULT_PAGE} (target {:.1} MiB{draft})",
                    pages * DEFAULT_PAGE,
                    mib(t.kv_bytes()),
                );
                Ok(Loaded::Cpu(t, d))
            }
            // The CUDA pages are planned with the batch (`boxed_or_batched`); one request at a
            // time holds its --max-context cache, already capped at the capacity.
            cuda => Ok(cuda),
        }
    }

    /// Boxed for the solo engine (`max_batch` 1), or holding `max_batch` sequences each: the CPU
    /// models through `Sequences`, the CUDA target as a `CudaBatch` and the draft as `CudaDrafts` (K/V caches for every
    /// sequence planned now) and the draft's contexts reserved.
    fn boxed_or_batched(self, max_batch: usize, kv_capacity: Option<usize>) -> Result<Built> {
        use dspark_model::Drafter;
        if max_batch <= 1 {
            let (t, d) = self.boxed();
            return Ok(Built::Solo(t, d));
        }
        Ok(match self {
            Loaded::Cpu(t, Some(d)) => {
                let sampled = d.prefers_sampled_block();
                Built::Batched(Box::new(Sequences::new(t)), Box::new(Sequences::new(d)), sampled)
            }
            Loaded::Cuda(t, Some(mut d)) => {
                let sampled = d.prefers_sampled_block();
                let t = match kv_capacity {
                    None => {
                        d.reserve_sequences(max_batch).context("--max-batch: the draft's context caches")?;
                        dspark_model::cuda::qwen3::CudaBatch::new(t, max_batch)
                            .context("--max-batch: K/V caches for every sequence")?
                    }
                    Some(cap) => {
                        let t = dspark_model::cuda::qwen3::CudaBatch::paged(t, max_batch, cap)
                            .context("--kv-capacity: the target's K/V pages")?;
                        let b = t.kv_budget().context("--kv-capacity: the target's pages")?;
                        d.reserve_sequences_paged(max_batch, b).context("--kv-capacity: the draft's context pages")?;
                        let gib = |x: usize| x as f64 / (1u64 << 30) as f64;
                        eprintln!(
                            "dspark serve: K/V cache of {} positions: {} pages of {} ({:.2} GiB; the draft's contexts {:.2} GiB)",
                            b.pages * b.page,
                            b.pages,
                            b.page,
                            gib(t.kv_page_bytes().unwrap_or(0)),
                            gib(d.ctx_page_bytes().unwrap_or(0)),
                        );
                        t
                    }
                };
                Built::Batched(Box::new(t), Box::new(dspark_model::cuda::dspark::CudaDrafts::new(d)), sampled)
            }
            Loaded::Cpu(_, None) | Loaded::Cuda(_, None) => anyhow::bail!("--max-batch needs a draft"),
        })
    }
}
