//! Building a CUDA draft: its weights from a checkpoint or any [`WeightSource`], the target
//! side it drafts for ([`DraftHost`]: heads lent or its own copies, captures, proposal rows),
//! and every buffer planned once on its arena — the stacked context k|v rows (unless a small
//! card's plan leaves them out), the caches, the
//! GEMM prefill, the step and sampler words — so nothing is allocated while it drafts.

use super::{cfg_at, Confidence, CudaDraft, DraftHost, Markov, Variant};
use crate::checkpoint::draft_config::{DraftConfig, MarkovKind};
use crate::checkpoint::safetensors::Checkpoint;
use crate::checkpoint::shared_heads::SharedHeads;
use crate::cpu::dspark::check_tensors;
use crate::cuda::graphs::StepGraphs;
use crate::cuda::handoff::{DraftRows, SharedDraftRows};
use crate::cuda::layers::{drv, gpu_err, kv_caches, GpuLayer, Scratch};
use crate::cuda::prefill::{CtxKv, DraftPrefill, MAX_DRAFT_PREFILL_ROWS};
use crate::cuda::qwen3::{plan_sample, CudaQwen3, CHUNK};
use crate::cuda::weights::{CheckpointUpload, WeightSource};
use crate::error::{Error, Result};
use dspark_kernels::cpu::rope::inv_freq;
use dspark_kernels::cuda::host_table::Table;
use dspark_kernels::cuda::kv_layers::LayerCaches;
use dspark_kernels::cuda::ops::WeightBuf;
use dspark_kernels::cuda::sample::{CFG_WORDS, ROW_WORDS};
use dspark_kernels::cuda::Gpu;
use dspark_tensor::arena::Arena;
use std::path::Path;
use std::sync::Arc;

impl CudaDraft {
    /// Loads a draft folder for `target` (borrowing its embedding / output head when the draft
    /// has none), with a context of `target.max_len()` positions.
    pub fn load(dir: &Path, target: &CudaQwen3) -> Result<CudaDraft> {
        let cfg = DraftConfig::from_dir(dir)?;
        let ck = Checkpoint::open_dir(dir)?;
        check_tensors(&cfg, &ck)?;
        let up = CheckpointUpload::new(&ck, &target.gpu.ctx, 0)?;
        let d = Self::from_source(cfg, &up, target)?;
        up.finish()?;
        Ok(d)
    }

    /// The draft tensors that stay in mapped host memory when its target's embedding does
    /// (`--embeddings host`): Markov W1, only gathered (a row a slot), where its rows are whole
    /// 16-byte chunks (a multiple of 8 values) for the host gather. A loader leaves them out of
    /// its device-memory check.
    pub fn host_tensors(cfg: &DraftConfig, host_tables: bool) -> &'static [&'static str] {
        if host_tables && cfg.markov_rank > 0 && cfg.markov_rank.is_multiple_of(8) {
            &["markov_head.markov_w1.weight"]
        } else {
            &[]
        }
    }

    /// The draft checkpoint's tensors a loader leaves off the device (and out of its memory
    /// check): the copies of the target's heads that `shared` found equal, and what follows a
    /// host embedding ([`CudaDraft::host_tensors`]).
    pub fn kept_off_device(cfg: &DraftConfig, shared: SharedHeads, host_tables: bool) -> Vec<&'static str> {
        let heads = [("embed_tokens.weight", shared.embed_tokens), ("lm_head.weight", shared.lm_head)];
        let mut skip: Vec<&'static str> = heads.into_iter().filter_map(|(n, s)| s.then_some(n)).collect();
        skip.extend(Self::host_tensors(cfg, host_tables));
        skip
    }

    /// Builds the draft from any [`WeightSource`] (a checkpoint, or random bench weights).
    pub fn from_source(cfg: DraftConfig, ck: &dyn WeightSource, target: &CudaQwen3) -> Result<CudaDraft> {
        Self::from_source_sharing(cfg, ck, target, SharedHeads::default())
    }

    /// [`CudaDraft::from_source`], using the target's buffers for the draft's own
    /// `embed_tokens` / `lm_head` copies that `shared` found byte for byte equal to the target's
    /// (`checkpoint::shared_heads`): they are not uploaded.
    pub fn from_source_sharing(
        cfg: DraftConfig,
        ck: &dyn WeightSource,
        target: &CudaQwen3,
        shared: SharedHeads,
    ) -> Result<CudaDraft> {
        Self::from_host(cfg, ck, &DraftHost::of(target), shared)
    }

    /// The draft for the target side `host` (a single-GPU target's, or rank 0 of a split one's,
    /// `host.rs`): the draft's own `embed_tokens` / `lm_head` unless `shared` found them equal to
    /// the host's whole ones, or it has none and the host lends its.
    pub fn from_host(
        cfg: DraftConfig,
        ck: &dyn WeightSource,
        host: &DraftHost,
        shared: SharedHeads,
    ) -> Result<CudaDraft> {
        cfg.validate_against(&host.cfg)?;
        let gpu = host.gpu.clone();
        let arena = Arena::new(gpu.stream.clone());
        let l = &cfg.layer;
        let (h, v, r, b) = (l.hidden_size, l.vocab_size, cfg.markov_rank, cfg.block_size);
        if b + 1 > CHUNK {
            return Err(Error::Config {
                path: "config.json".into(),
                field: "block_size".into(),
                msg: format!("{b}: the CUDA draft verifies at most {} drafts per round", CHUNK - 1),
            });
        }
        let own = |name: &str, share: bool| -> Result<Option<Arc<WeightBuf>>> {
            if ck.contains(name) && !share {
                Ok(Some(Arc::new(ck.matrix(&arena, name, &[v, h])?)))
            } else {
                Ok(None)
            }
        };
        // The draft's own tables (when not the target's) stay on the device; a split target's
        // heads are vocabulary shards, so such a draft must carry its own.
        let lent = host.heads.is_some();
        let none = |name: &str| {
            Error::Request(format!(
                "{name}: the draft carries none, and its target's is split over GPUs (--tensor-parallel)"
            ))
        };
        let embed_tokens = match own("embed_tokens.weight", shared.embed_tokens && lent)? {
            Some(w) => Arc::new(Table::Device(w)),
            None => host.heads.as_ref().map(|(e, _)| e.clone()).ok_or_else(|| none("embed_tokens.weight"))?,
        };
        let lm_head = match own("lm_head.weight", shared.lm_head && lent)? {
            Some(w) => w,
            None => host.heads.as_ref().map(|(_, h)| h.clone()).ok_or_else(|| none("lm_head.weight"))?,
        };
        let host_tables = host.heads.as_ref().is_some_and(|(e, _)| matches!(**e, Table::Host(_)));
        let shared_bytes = usize::from(shared.embed_tokens && lent) * embed_tokens.bytes()
            + usize::from(shared.lm_head && lent) * lm_head.bytes();
        let markov = if r > 0 {
            let variant = match cfg.markov_kind {
                MarkovKind::Vanilla => Variant::Vanilla,
                MarkovKind::Gated => Variant::Gated {
                    weight: ck.vector(&arena, "markov_head.gate_proj.weight", &[r, h + r])?,
                    bias: ck.vector(&arena, "markov_head.gate_proj.bias", &[r])?,
                },
                MarkovKind::Rnn => Variant::Rnn {
                    weight: ck.vector(&arena, "markov_head.joint_proj.weight", &[3 * r, 2 * r + h])?,
                    bias: ck.vector(&arena, "markov_head.joint_proj.bias", &[3 * r])?,
                    state: arena.zeros(r).map_err(drv)?,
                    scratch: arena.zeros(3 * r).map_err(drv)?,
                },
            };
            // W1 is only gathered (a row a slot): with the target's embedding in mapped host
            // memory (`--embeddings host`) it goes there too, 78 MB of the 8B draft's device
            // memory for a PCIe round trip in each slot's gather.
            let w1_name = "markov_head.markov_w1.weight";
            let w1 = if !Self::host_tensors(&cfg, host_tables).is_empty() {
                Table::Host(ck.host_table(&gpu.ctx, w1_name, &[v, r])?)
            } else {
                Table::Device(Arc::new(ck.matrix(&arena, w1_name, &[v, r])?))
            };
            Some(Markov { rank: r, w1, w2: ck.matrix(&arena, "markov_head.markov_w2.weight", &[v, r])?, variant })
        } else {
            None
        };
        let confidence = if cfg.confidence_head {
            let bias = if ck.contains("confidence_head.proj.bias") {
                ck.host("confidence_head.proj.bias", &[1])?[0]
            } else {
                0.0
            };
            Some(Confidence {
                weight: ck.vector(&arena, "confidence_head.proj.weight", &[1, cfg.confidence_in()])?,
                bias,
                with_markov: cfg.confidence_with_markov,
            })
        } else {
            None
        };
        let max_len = host.max_len;
        let kv = l.kv_dim();
        let t = cfg.num_taps();
        let rows = CHUNK.max(b);
        let z = |n: usize| arena.zeros::<f32>(n).map_err(drv);
        let n_layers = l.num_hidden_layers;
        let layers = (0..n_layers)
            .map(|i| GpuLayer::load(&arena, l, ck, &format!("layers.{i}.")))
            .collect::<Result<Vec<_>>>()?;
        crate::cuda::layers_gemm::plan_row_gemms(&gpu, l, &layers);
        crate::cuda::layers_gemm::plan_head(&gpu, &lm_head, h, l.vocab_size);
        check_one_dtype(&layers)?;
        // A small card's plan (the target's embedding in host memory) keeps no stacked copy.
        let ctx_kv = if host_tables { None } else { Some(stack_kv_rows(&arena, &gpu, &layers, (l.q_dim(), kv, h))?) };
        let hd = l.head_dim;
        let mut ctx_k_norm = z(n_layers * hd)?;
        for (i, lw) in layers.iter().enumerate() {
            gpu.stream.memcpy_dtod(&lw.k_norm, &mut ctx_k_norm.slice_mut(i * hd..(i + 1) * hd)).map_err(drv)?;
        }
        // The draft's caches take the target's element type (`--kv-cache`).
        let cache_len = (max_len + b) * kv;
        let caches = kv_caches(&arena, host.kv_dtype, n_layers, cache_len)?;
        let ptrs = (arena.zeros::<u64>(n_layers).map_err(drv)?, arena.zeros::<u64>(n_layers).map_err(drv)?);
        let caches = LayerCaches::new(&gpu, caches, ptrs, kv).map_err(gpu_err)?;
        let fc = ck.matrix(&arena, "fc.weight", &[h, t * h])?;
        let prefill = match host.prefill_blas.clone() {
            Some(blas) if max_len > CHUNK => {
                // No more rows than the target's chunks hand over (`--prefill-chunk`).
                let rows = max_len.min(MAX_DRAFT_PREFILL_ROWS).min(host.prefill_rows.max(1));
                let ctx = ctx_kv_of(&ctx_kv, &layers, l.q_dim());
                Some(DraftPrefill::new(&arena, blas, rows, (t, h, n_layers * 2 * kv), &fc, ctx)?)
            }
            _ => None,
        };
        Ok(CudaDraft {
            prefill_capture: prefill.as_ref().and(host.prefill_capture.clone()),
            prefill,
            fc,
            hidden_norm: ck.vector(&arena, "hidden_norm.weight", &[h])?,
            layers,
            norm: ck.vector(&arena, "norm.weight", &[h])?,
            inv_freq: arena.upload(&inv_freq(l.rope_theta as f32, l.head_dim)).map_err(drv)?,
            caches: super::paged::CtxCaches::owned(caches),
            seq_pool: Vec::new(),
            ctx_pages: None,
            block_batch: None,
            ctx_kv,
            ctx_k_norm,
            ctx_out: z(CHUNK * n_layers * 2 * kv)?,
            scratch: Scratch::new(&arena, l, rows, gpu.sms)?,
            features: Some(z(CHUNK * t * h)?),
            capture: host.capture.clone(),
            c: z(CHUNK * h)?,
            x: z(rows * h)?,
            hidden: z(b * h)?,
            rows: install_rows(&arena, host, b * v, b * ROW_WORDS)?,
            step_in: arena.zeros::<u32>(cfg_at(b) + b * CFG_WORDS).map_err(drv)?,
            sample: plan_sample(&arena, 1, v)?,
            slot_out: arena.zeros::<u32>(4 * b).map_err(drv)?,
            graphs: StepGraphs::new(),
            device_sampling: true,
            device_blocks: 0,
            tokens: host.tokens.clone(),
            e: z((b * r).max(1))?,
            u: z(r.max(1))?,
            conf_logits: z(b)?,
            gpu,
            arena,
            cfg,
            max_len,
            embed_tokens,
            lm_head,
            shared_bytes,
            markov,
            confidence,
            ctx_len: 0,
        })
    }
}

/// The draft rows' slot of `target`, with buffers of at least `logits` and `state` elements
/// installed (a draft loaded before with a smaller block gets larger ones; graphs key on their
/// address, so none replays a freed buffer).
fn install_rows(arena: &Arena, host: &DraftHost, logits: usize, state: usize) -> Result<SharedDraftRows> {
    let shared = host.draft_rows.clone();
    {
        let mut slot = shared.lock().map_err(|_| Error::Request("draft rows poisoned".into()))?;
        if slot.as_ref().is_none_or(|r| r.logits.len() < logits || r.state.len() < state) {
            *slot =
                Some(DraftRows { logits: arena.zeros(logits).map_err(drv)?, state: arena.zeros(state).map_err(drv)? });
        }
    }
    Ok(shared)
}

/// The context k|v projection of a draft holding `stacked` (or not) over `layers` of `q` query
/// rows each.
pub(super) fn ctx_kv_of<'a>(stacked: &'a Option<WeightBuf>, layers: &'a [GpuLayer], q: usize) -> CtxKv<'a> {
    match stacked {
        Some(w) => CtxKv::Stacked(w),
        None => CtxKv::Layers(layers, q),
    }
}

/// Refuses layers whose q|k|v matrices differ in dtype: the context rows enter every layer's
/// projection as one input, in that dtype.
fn check_one_dtype(layers: &[GpuLayer]) -> Result<()> {
    let Some(first) = layers.first() else { return Ok(()) };
    let same = |a: &WeightBuf, b: &WeightBuf| std::mem::discriminant(a) == std::mem::discriminant(b);
    match layers.iter().position(|lw| !same(&lw.qkv_proj, &first.qkv_proj)) {
        Some(i) => Err(mixed_dtypes(i)),
        None => Ok(()),
    }
}

fn mixed_dtypes(layer: usize) -> Error {
    Error::Request(format!(
        "draft layers.{layer}.self_attn: q/k/v_proj load in another dtype than layers.0's; \
         the CUDA draft needs one dtype for all layers' k_proj|v_proj"
    ))
}

/// Every layer's k_proj|v_proj rows — rows `q .. q + 2·kv` of its stacked q|k|v matrix — in one
/// `[layers · 2·kv, H]` matrix, copied on the device so it always matches the layers' own.
fn stack_kv_rows(
    arena: &Arena,
    gpu: &Gpu,
    layers: &[GpuLayer],
    (q, kv, h): (usize, usize, usize),
) -> Result<WeightBuf> {
    let n = layers.len() * 2 * kv * h;
    let src = q * h..(q + 2 * kv) * h;
    let dst = |i: usize| i * 2 * kv * h..(i + 1) * 2 * kv * h;
    let mut out = match layers.first().map(|lw| &lw.qkv_proj) {
        Some(WeightBuf::F32(_)) => WeightBuf::F32(arena.zeros(n).map_err(drv)?),
        Some(WeightBuf::F16(_)) => WeightBuf::F16(arena.zeros(n).map_err(drv)?),
        _ => WeightBuf::Bf16(arena.zeros(n).map_err(drv)?),
    };
    for (i, lw) in layers.iter().enumerate() {
        match (&lw.qkv_proj, &mut out) {
            (WeightBuf::Bf16(s), WeightBuf::Bf16(d)) | (WeightBuf::F16(s), WeightBuf::F16(d)) => {
                gpu.stream.memcpy_dtod(&s.slice(src.clone()), &mut d.slice_mut(dst(i)))
            }
            (WeightBuf::F32(s), WeightBuf::F32(d)) => {
                gpu.stream.memcpy_dtod(&s.slice(src.clone()), &mut d.slice_mut(dst(i)))
            }
            _ => return Err(mixed_dtypes(i)),
        }
        .map_err(drv)?;
    }
    Ok(out)
}
