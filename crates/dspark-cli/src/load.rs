//! Where `generate` and `serve` get their models: the device a run takes ([`resolve_device`]),
//! a model's files ([`Source`]: a folder, or the demo pair compiled into the binary), and the
//! loading itself — the target and its draft on the CPU or one GPU ([`load_typed`], in their own
//! types, which `serve --max-batch` batches), or the target split over GPUs ([`load_split`]).
//! Each checks what it reads and names the file, tensor or flag at fault.

use crate::demo::EmbeddedModel;
use anyhow::{bail, Result};
use clap::ValueEnum;
use dspark_kernels::{Activations, KvDtype};
use dspark_model::checkpoint::draft_config::DraftConfig;
use dspark_model::checkpoint::generation_config::GenerationConfig;
use dspark_model::checkpoint::safetensors::Checkpoint;
use dspark_model::checkpoint::shared_heads::SharedHeads;
use dspark_model::checkpoint::tokenizer::{eos_ids, eos_ids_from, Tokenizer};
use dspark_model::cpu::dspark::{check_tensors, CpuDraft, DraftWeights};
use dspark_model::cpu::qwen3::{CpuQwen3, Qwen3Weights};
use dspark_model::cuda::dspark::{CudaDraft, DraftHost, DraftSide};
use dspark_model::cuda::fit::{device_bytes, device_bytes_without};
use dspark_model::cuda::plan::{Embeddings, TargetPlan};
use dspark_model::cuda::prefill::PrefillMode;
use dspark_model::cuda::qwen3::CudaQwen3;
use dspark_model::cuda::weights::CheckpointUpload;
use dspark_model::{Drafter, Qwen3Config, TargetModel};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    Cpu,
    Cuda,
}

impl Device {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

/// Where a model's files come from: a folder, or the demo pair compiled into the binary. Both
/// go through the same parsers and checks, and the loaders below make the same calls as
/// `CpuQwen3::load`, `CpuDraft::load`, `CudaQwen3::load_kv` and `CudaDraft::load` do on a
/// folder.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    Dir(&'a Path),
    Embedded(&'static EmbeddedModel),
}

impl Source<'_> {
    /// The path of one of the model's files, for messages (virtual for the embedded demo).
    pub(crate) fn file(self, name: &str) -> PathBuf {
        match self {
            Source::Dir(d) => d.join(name),
            Source::Embedded(m) => m.file(name),
        }
    }

    pub(crate) fn tokenizer(self) -> dspark_model::Result<Option<Tokenizer>> {
        match self {
            Source::Dir(d) => Tokenizer::from_dir(d),
            Source::Embedded(m) => m.tokenizer(),
        }
    }

    pub(crate) fn target_config(self) -> dspark_model::Result<Qwen3Config> {
        match self {
            Source::Dir(d) => Qwen3Config::from_dir(d),
            Source::Embedded(m) => Qwen3Config::from_json(&m.config_json()?),
        }
    }

    pub(crate) fn draft_config(self) -> dspark_model::Result<DraftConfig> {
        match self {
            Source::Dir(d) => DraftConfig::from_dir(d),
            Source::Embedded(m) => DraftConfig::from_json(&m.config_json()?),
        }
    }

    pub(crate) fn checkpoint(self) -> dspark_model::Result<Checkpoint> {
        match self {
            Source::Dir(d) => Checkpoint::open_dir(d),
            Source::Embedded(m) => m.checkpoint(),
        }
    }

    /// `generation_config.json`, parsed, if the model has one.
    pub(crate) fn generation_config(self) -> dspark_model::Result<Option<GenerationConfig>> {
        match self {
            Source::Dir(d) => GenerationConfig::from_dir(d),
            Source::Embedded(m) => m.generation_config_json()?.map(|j| GenerationConfig::from_json(&j)).transpose(),
        }
    }

    /// Stop ids from `generation_config.json` (if any) and `config.json`'s.
    pub(crate) fn eos_ids(self, config_eos: &[u32]) -> dspark_model::Result<Vec<u32>> {
        match self {
            Source::Dir(d) => eos_ids(d, config_eos),
            Source::Embedded(m) => eos_ids_from(m.generation_config_json()?.as_ref(), config_eos),
        }
    }
}

/// A loaded target and its draft, if any.
pub(crate) type Models = (Box<dyn TargetModel>, Option<Box<dyn Drafter>>);

/// The models as their backend's own types (`serve --max-batch` builds its batched models from
/// them). Made once per process and boxed or batched at once, so its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Loaded {
    Cpu(CpuQwen3, Option<CpuDraft>),
    Cuda(CudaQwen3, Option<CudaDraft>),
}

impl Loaded {
    pub(crate) fn boxed(self) -> Models {
        match self {
            Loaded::Cpu(t, d) => (Box::new(t), d.map(|d| Box::new(d) as Box<dyn Drafter>)),
            Loaded::Cuda(t, d) => (Box::new(t), d.map(|d| Box::new(d) as Box<dyn Drafter>)),
        }
    }
}

/// The target (and the draft, when given) built from their folders or the embedded demo on
/// `device`, in their own types (`.boxed()` for the loops): the loading `generate` and `serve`
/// share. `cfg` is the target's config, read by the caller (which checks the prompt against it
/// first).
pub(crate) fn load_typed(
    target_src: Source<'_>,
    draft_src: Option<Source<'_>>,
    cfg: Qwen3Config,
    device: Device,
    plans: &[TargetPlan],
    prefill: PrefillMode,
    activations: Activations,
) -> Result<Loaded> {
    let Some(&first) = plans.first() else { bail!("no memory plan to load with") };
    check_activations(device, activations)?;
    check_activations_for(&cfg, &target_src.file("config.json"), activations)?;
    let kv_cache = first.kv;
    Ok(match device {
        Device::Cpu => {
            // The target's checkpoint stays mapped until the draft is in: the draft's own
            // embed_tokens / lm_head copies are compared with its bytes, and shared when equal.
            let tck = target_src.checkpoint()?;
            let w = Qwen3Weights::load(&cfg, &tck)?;
            let (tied, shape) = (cfg.tie_word_embeddings, [cfg.vocab_size, cfg.hidden_size]);
            let t = CpuQwen3::new(cfg, w).with_kv_dtype(kv_cache);
            let d = match draft_src {
                Some(src) => {
                    let dcfg = src.draft_config()?;
                    dcfg.validate_against(t.config())?;
                    let ck = src.checkpoint()?;
                    let shared = SharedHeads::find(&ck, &tck, tied, shape);
                    let w = DraftWeights::load_sharing(&dcfg, &ck, t.weights(), shared)?;
                    Some(CpuDraft::new(dcfg, w).with_kv_dtype(kv_cache))
                }
                None => None,
            };
            Loaded::Cpu(t, d)
        }
        Device::Cuda => {
            let mut gpu = dspark_kernels::cuda::Gpu::new(0)?;
            gpu.set_activations(activations)?;
            let gpu = std::sync::Arc::new(gpu);
            let tck = target_src.checkpoint()?;
            let (tied, shape) = (cfg.tie_word_embeddings, [cfg.vocab_size, cfg.hidden_size]);
            // The draft is opened first: the fit counts its bytes too.
            let draft = match draft_src {
                Some(src) => {
                    let (dcfg, ck) = (src.draft_config()?, src.checkpoint()?);
                    check_tensors(&dcfg, &ck)?;
                    let shared = SharedHeads::find(&ck, &tck, tied, shape);
                    Some((dcfg, ck, shared))
                }
                None => None,
            };
            let plan = fit(&gpu, &cfg, &tck, draft.as_ref(), plans, prefill)?;
            // Weights through pinned staging buffers, after a check that those the device keeps
            // and the plan's buffers fit (a host embedding is read straight from the file).
            plan.check(&cfg)?;
            let up = CheckpointUpload::new_without(&tck, &gpu.ctx, plan.device_bytes(&cfg), plan.host_tensors())?
                .with_progress(crate::progress::load_bar(), "target");
            let mut t = CudaQwen3::from_source_plan(gpu, cfg, &up, plan)?;
            up.finish()?;
            t.set_prefill(prefill);
            let d = match draft {
                Some((dcfg, ck, shared)) => {
                    // The draft's copies of the target's matrices, when byte-equal, stay on the
                    // host (the draft uses the target's buffers), as does what follows the
                    // target's embedding there (Markov W1).
                    let skip = CudaDraft::kept_off_device(&dcfg, shared, plan.embeddings == Embeddings::Host);
                    // Beside the weights, the caches and buffers the draft plans (dspark/plan.rs).
                    let planned = CudaDraft::planned_bytes(&dcfg, &DraftHost::of(&t), CudaDraft::layer_elem(&ck));
                    let up = CheckpointUpload::new_without(&ck, &t.gpu.ctx, planned, &skip)?
                        .with_progress(crate::progress::load_bar(), "draft");
                    let d = CudaDraft::from_source_sharing(dcfg, &up, &t, shared)?;
                    up.finish()?;
                    Some(d)
                }
                None => None,
            };
            Loaded::Cuda(t, d)
        }
    })
}

/// The plan to load with (`memory::choose`): each of `plans` counted as the loads below count
/// it — the target's device-resident weights and planned buffers, and the draft's, beside the
/// target's side that plan gives (`DraftSide::of_plan`) — against the GPU's free memory.
fn fit(
    gpu: &dspark_kernels::cuda::Gpu,
    cfg: &Qwen3Config,
    tck: &Checkpoint,
    draft: Option<&(DraftConfig, Checkpoint, SharedHeads)>,
    plans: &[TargetPlan],
    prefill: PrefillMode,
) -> Result<TargetPlan> {
    let need: Vec<Option<usize>> = plans
        .iter()
        .map(|plan| {
            plan.check(cfg).ok()?;
            let target = device_bytes_without(tck, plan.host_tensors()) + plan.device_bytes(cfg);
            let draft = draft.map_or(0, |(dcfg, ck, shared)| {
                let skip = CudaDraft::kept_off_device(dcfg, *shared, plan.embeddings == Embeddings::Host);
                let side = DraftSide::of_plan(cfg, plan, prefill, gpu.sms);
                device_bytes_without(ck, &skip) + CudaDraft::planned_bytes_for(dcfg, &side, CudaDraft::layer_elem(ck))
            });
            Some(target + draft)
        })
        .collect();
    let free = if plans.len() > 1 { gpu.ctx.mem_get_info()?.0 } else { 0 };
    let (plan, note) = crate::memory::choose(plans, &need, free)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    Ok(plan)
}

/// `--tensor-parallel N` (N ≥ 2): the target split over GPUs 0..N (`cuda::tp`), and the draft,
/// when given, on GPU 0 with its own `embed_tokens` / `lm_head` (the target's are split).
pub(crate) fn load_split(
    n: usize,
    target_src: Source<'_>,
    draft_src: Option<Source<'_>>,
    device: Device,
    max_context: usize,
    kv_cache: KvDtype,
    activations: Activations,
) -> Result<Models> {
    let Source::Dir(dir) = target_src else {
        bail!("--tensor-parallel {n}: give --target DIR (the embedded demo runs on one device)");
    };
    if device != Device::Cuda {
        bail!("--tensor-parallel {n}: needs --device cuda");
    }
    let have = cudarc::driver::CudaContext::device_count().map_or(0, |c| c as usize);
    if n > have {
        bail!("--tensor-parallel {n}: this machine has {have} GPU(s)");
    }
    let gpus = (0..n)
        .map(|i| {
            dspark_kernels::cuda::Gpu::new(i).and_then(|mut g| {
                g.set_activations(activations)?;
                Ok(std::sync::Arc::new(g))
            })
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut target = dspark_model::cuda::tp::CudaQwen3Tp::load(gpus, dir, max_context, kv_cache)?;
    let draft = match draft_src {
        Some(src) => {
            let (dcfg, ck) = (src.draft_config()?, src.checkpoint()?);
            check_tensors(&dcfg, &ck)?;
            let host = target.draft_host()?;
            // Rank 0 holds the draft whole, with its own heads: its weights and planned buffers
            // must fit there, checked before any of them is allocated.
            let planned = CudaDraft::planned_bytes(&dcfg, &host, CudaDraft::layer_elem(&ck));
            let dir = dspark_model::cuda::fit::checkpoint_dir(&ck);
            dspark_model::cuda::fit::check_fits(&host.gpu.ctx, &dir, device_bytes(&ck), planned)?;
            let d = CudaDraft::from_host(dcfg, &ck, &host, SharedHeads::default())?;
            Some(Box::new(d) as Box<dyn Drafter>)
        }
        None => None,
    };
    Ok((Box::new(target), draft))
}

/// The device a run takes: the one asked for, else CUDA when a GPU is present, else the CPU;
/// asking for CUDA without one is a one-line error (`generate` and `serve`).
/// `--activations bf16|e4m3` needs the GPU: the CPU reference keeps its activations f32.
pub(crate) fn check_activations(device: Device, activations: Activations) -> Result<()> {
    if activations != Activations::F32 && device != Device::Cuda {
        bail!("--activations {}: needs --device cuda (the CPU reference keeps f32 activations)", activations.name());
    }
    Ok(())
}

/// `--activations e4m3` is for FP8 targets: on bf16 weights it would change nothing.
pub(crate) fn check_activations_for(cfg: &Qwen3Config, config: &Path, activations: Activations) -> Result<()> {
    if activations == Activations::E4m3 && cfg.quantization.is_none() {
        bail!(
            "--activations e4m3: {} has no quantization_config, so the target's weights are not FP8; E4M3 activations are for FP8 targets",
            config.display()
        );
    }
    Ok(())
}

pub(crate) fn resolve_device(asked: Option<Device>) -> Result<Device> {
    let device = match asked {
        Some(d) => d,
        None if dspark_kernels::cuda::available() => Device::Cuda,
        None => Device::Cpu,
    };
    if device == Device::Cuda && !dspark_kernels::cuda::available() {
        bail!("--device cuda: no NVIDIA driver (libcuda) or no CUDA device found on this machine; use --device cpu");
    }
    Ok(device)
}
