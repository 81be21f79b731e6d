//! What a CUDA draft plans on its arena beyond its checkpoint's tensors, counted before it
//! loads: a loader adds it to the draft's memory check (`CheckpointUpload::new_without`), so a
//! card whose free memory holds the draft's weights but not its caches and buffers gets the
//! check's error — naming the folder, the bytes and the flags that plan less — instead of the
//! driver's out-of-memory in the middle of the load.
//!
//! The count mirrors `build.rs`, buffer by buffer, for the same inputs — the target side
//! ([`DraftHost`]: context, KV element type, where the embedding lives, the GEMM prefill's
//! chunk) and the GPU's SM count (the attention partials) — leaving out what is smaller than a
//! kilobyte (the cache address arrays, the RoPE frequencies). The GPU tier
//! compares it with the arena of a built draft (`gpu_model::memory_plan`).

use super::{cfg_at, CudaDraft, DraftHost};
use crate::checkpoint::config::Qwen3Config;
use crate::checkpoint::draft_config::{DraftConfig, MarkovKind};
use crate::checkpoint::safetensors::Checkpoint;
use crate::cuda::plan::{Embeddings, TargetPlan};
use crate::cuda::prefill::{PrefillMode, MAX_DRAFT_PREFILL_ROWS};
use crate::cuda::qwen3::CHUNK;
use dspark_kernels::cuda::host_table::Table;
use dspark_kernels::cuda::kv::KvDtype;
use dspark_kernels::cuda::ops::OpScratch;
use dspark_kernels::cuda::sample::{SampleScratch, CFG_WORDS, ROW_WORDS};

/// What a draft's plan takes from its target side: known from a built target
/// ([`DraftSide::of_host`]) or, before either loads, from the target's plan
/// ([`DraftSide::of_plan`]) — which is how a loader fitting both to the GPU counts the draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftSide {
    /// The GPU's SM count (the attention partials are sized to it).
    pub sms: usize,
    /// Context positions.
    pub max_len: usize,
    pub kv_dtype: KvDtype,
    /// Whether the target's embedding is in mapped host memory (then so is Markov W1, and the
    /// context k|v rows are projected a layer at a time).
    pub host_tables: bool,
    /// Rows of the target's GEMM prefill chunks; `None` when it has no GEMM prefill.
    pub prefill_rows: Option<usize>,
}

impl DraftSide {
    /// The side of a built target.
    pub fn of_host(host: &DraftHost) -> DraftSide {
        DraftSide {
            sms: host.gpu.sms,
            max_len: host.max_len,
            kv_dtype: host.kv_dtype,
            host_tables: host.heads.as_ref().is_some_and(|(e, _)| matches!(**e, Table::Host(_))),
            prefill_rows: host.prefill_blas.as_ref().map(|_| host.prefill_rows),
        }
    }

    /// The side a target of `cfg` built as `plan` on a GPU of `sms` SMs, run in `mode`, will
    /// offer (`CudaQwen3::from_source_plan`, then `set_prefill`).
    pub fn of_plan(cfg: &Qwen3Config, plan: &TargetPlan, mode: PrefillMode, sms: usize) -> DraftSide {
        let rows = plan.gemm_rows(cfg);
        DraftSide {
            sms,
            max_len: plan.context(cfg),
            kv_dtype: plan.kv,
            host_tables: plan.embeddings == Embeddings::Host,
            prefill_rows: (rows > 0 && mode == PrefillMode::Gemm).then_some(rows),
        }
    }
}

impl CudaDraft {
    /// Bytes a value of the draft checkpoint `ck`'s layer weights (its first layer's k_proj:
    /// 2 for bf16 and f16, 4 for f32; 2 when it has none, which its load then refuses).
    pub fn layer_elem(ck: &Checkpoint) -> usize {
        ck.tensors.get("layers.0.self_attn.k_proj.weight").and_then(|t| t.dtype).map_or(2, |d| d.size())
    }

    /// Device bytes a draft of `cfg`, whose layers' q|k|v weights take `elem` bytes a value (2
    /// for bf16), plans beyond its checkpoint's tensors for the target side `host`.
    pub fn planned_bytes(cfg: &DraftConfig, host: &DraftHost, elem: usize) -> usize {
        Self::planned_bytes_for(cfg, &DraftSide::of_host(host), elem)
    }

    /// [`CudaDraft::planned_bytes`] for a target side described by its values.
    pub fn planned_bytes_for(cfg: &DraftConfig, host: &DraftSide, elem: usize) -> usize {
        let l = &cfg.layer;
        let (h, v, r, b) = (l.hidden_size, l.vocab_size, cfg.markov_rank, cfg.block_size);
        let (q, kv, i, hd, n) = (l.q_dim(), l.kv_dim(), l.intermediate_size, l.head_dim, l.num_hidden_layers);
        let (t, width, rows) = (cfg.num_taps(), n * 2 * kv, CHUNK.max(b));
        let f32s = |values: usize| 4 * values;
        let host_tables = host.host_tables;
        // The stacked k|v copy, unless the small plan projects a layer at a time.
        let stacked = if host_tables { 0 } else { width * h * elem };
        let caches = 2 * n * (host.max_len + b) * kv * host.kv_dtype.bytes();
        // Scratch::new for `rows` rows, with its attention partials and split argmax.
        let (ao, aml, am, at) = OpScratch::sizes((l.num_attention_heads, l.num_key_value_heads, hd), host.sms);
        // (the bf16 rows of a row GEMM's input: 2 bytes a value)
        let scratch = f32s(rows * (h + (q + 2 * kv) + 2 * q + 3 * i + h.div_ceil(16)) + ao + aml + at)
            + 8 * am
            + 2 * rows * h.max(q).max(i);
        // ctx_k_norm, ctx_out, features, c, x, hidden; the proposal rows and their states.
        let step = f32s(n * hd + CHUNK * width + CHUNK * t * h + CHUNK * h + rows * h + b * h);
        let proposals = f32s(b * v + b * ROW_WORDS + cfg_at(b) + b * CFG_WORDS + 4 * b + (b * r).max(1) + r.max(1) + b);
        let z = SampleScratch::sizes(1, v);
        let sampler = f32s(z.state + z.part_f + z.part_u + z.tickets + z.out) + 8 * (z.part_d + z.cands);
        // The Markov and confidence heads' small matrices are read as f32 vectors: their f32
        // copies outgrow the checkpoint's `elem`-wide bytes (which the upload's check counts).
        let widened = |values: usize| values * 4usize.saturating_sub(elem);
        let markov = match (r, cfg.markov_kind) {
            (0, _) => 0,
            (_, MarkovKind::Vanilla) => 0,
            (_, MarkovKind::Gated) => widened(r * (h + r)),
            (_, MarkovKind::Rnn) => f32s(4 * r) + widened(3 * r * (2 * r + h)),
        };
        let confidence = if cfg.confidence_head { widened(cfg.confidence_in()) } else { 0 };
        // DraftPrefill: a GEMM chunk's features (and their 16-bit copy), fc output, k|v rows.
        let prefill = match host.prefill_rows {
            Some(rows) if host.max_len > CHUNK => {
                let p = host.max_len.min(MAX_DRAFT_PREFILL_ROWS).min(rows.max(1));
                let half = if elem == 2 { 2 * p * t * h } else { 2 };
                let f32_in = if elem == 2 { 1 } else { p * h };
                f32s(p * t * h + f32_in + p * h + p * width) + half
            }
            _ => 0,
        };
        stacked + caches + scratch + step + proposals + sampler + markov + confidence + prefill
    }
}
